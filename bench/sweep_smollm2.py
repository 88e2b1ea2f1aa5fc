"""A `sweep` job on the packaged SmolLM2-135M (or `--model`): PPL at several sparsities of SliceGPT
(or `--method`), laws fitted and stored.

Usage (from the repository root):

    HF_HUB_OFFLINE=1 .venv/bin/python bench/sweep_smollm2.py          # issue 5: s = 0, 0.1 ... 0.4
    HF_HUB_OFFLINE=1 .venv/bin/python bench/sweep_smollm2.py --help

The job runs exactly as a user's would, in the embedded deployment: a fresh SQLite store in a
temporary home, migrated, the app from `app.main.create_app`, the job submitted with
`POST /v1/jobs` and run by the in-process worker thread (`workers.tasks.execute_job`), progress
polled with `GET /v1/jobs/{id}`, then `GET /v1/jobs/{id}/results` and `GET /v1/fits?job_id=...`.
The converted model and token ids are cached under `--cache-dir` (default `$PRUNECAST_CACHE_DIR`,
else `.prunecast/cache`, git-ignored) so later runs skip the GGUF conversion.

Default protocol (cheap, the "subset protocol" of issue 5; results depend on it, so it is recorded
with every number): calibration 32 windows x 256 tokens of the packaged BoolQ passages, seed 42,
engine batch 8; perplexity on WikiText-2 test, seqlen 512, first 4 windows (2044 tokens scored);
fp32 on CPU, `--threads` torch threads (default 1: on the shared 2-core machine a second thread
mostly spins against other tenants' work).

Besides the stored fit, the JSON compares the laws on the measured points in the same run: the
strict law PPL0 ** (1 / (1 - s)) against every point, and a held-out check, the calibrated law
fitted on the two lowest pruned sparsities predicting the others.
Writes `bench/out/sweep_smollm2.json` (and stdout).
"""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path
from typing import Any

import harness
from fastapi.testclient import TestClient

from app.main import create_app
from core.prediction import laws


def parse_args() -> argparse.Namespace:
    made = harness.parser(__doc__, "sweep_smollm2", threads=1)
    harness.add_model_args(made)
    harness.add_calibration_args(made, sequences=32, length=256)
    harness.add_protocol_args(made, seqlen=512, windows=4)
    harness.add_store_args(made, home="optional")
    made.add_argument("--method", default="slicegpt", help="any pruning method a sweep takes")
    made.add_argument("--sparsities", type=float, nargs="+", default=[0.0, 0.1, 0.2, 0.3, 0.4])
    made.add_argument("--calibration-batch", type=int, default=8)
    made.add_argument(
        "--model-root", type=Path, action="append", default=[], help="allow local model folders below this"
    )
    made.add_argument("--poll-s", type=float, default=2.0)
    made.add_argument("--timeout-s", type=float, default=4 * 3600)
    return made.parse_args()


def main() -> None:
    args = parse_args()
    harness.use_threads(args.threads)
    cpu_started, wall_started = time.process_time(), time.perf_counter()
    report = harness.start_report()
    body = {
        "kind": "sweep",
        "model": args.model,
        "method": args.method,
        "sparsities": args.sparsities,
        "calibration": {
            "corpus": args.calibration_corpus,
            "num_sequences": args.calibration_sequences,
            "seqlen": args.calibration_length,
            "batch_size": args.calibration_batch,
            "seed": args.calibration_seed,
        },
        "perplexity": harness.protocol_body(args),
    }
    report["request"] = body
    with contextlib.ExitStack() as stack:
        settings = harness.kept_or_scratch_store(args, stack, "prunecast-sweep-", args.model_root)
        with TestClient(create_app(settings, start_background=False)) as client:
            run_job(client, body, args, report)
    report["wall_s"] = round(time.perf_counter() - wall_started, 2)
    report["cpu_s"] = round(time.process_time() - cpu_started, 2)
    harness.finish_report(args.out, report)
    print(summary(report))


def run_job(
    client: TestClient, body: dict[str, Any], args: argparse.Namespace, report: dict[str, Any]
) -> None:
    submitted = client.post("/v1/jobs", json=body)
    submitted.raise_for_status()
    job_id = report["job_id"] = submitted.json()["id"]
    progress: list[dict[str, Any]] = []  # every distinct (stage, detail) seen while polling
    job = harness.follow(client, job_id, args.timeout_s, args.poll_s, seen=progress)
    report["job"] = {k: job[k] for k in ("status", "error", "attempts", "started_at", "finished_at")}
    report["progress"] = progress
    results = client.get(f"/v1/jobs/{job_id}/results").json()["items"]
    report["results"] = points_table(results)
    fits = client.get("/v1/fits", params={"job_id": job_id}).json()["items"]
    report["fits"] = fits
    if job["status"] != "succeeded":
        raise SystemExit(f"sweep {job['status']}: {job['error']}")
    report["laws_on_measured_points"] = compare_laws(report["results"], fits[0] if fits else None)


def points_table(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per sparsity: PPL, parameter fraction removed, width, timings, result ids."""
    rows: dict[float, dict[str, Any]] = {}
    for item in results:
        row = rows.setdefault(item["sparsity"], {"sparsity": item["sparsity"]})
        if item["metric"] == "ppl":
            protocol = item["protocol"]
            row.update(
                ppl=item["value"],
                ppl_result_id=item["id"],
                method=item["method"],
                seqlen=protocol["seqlen"],
                windows=protocol["windows"],
                tokens_scored=item["n"],
                data_sha256=protocol["data_sha256"],
            )
            if item["method"] != "dense":
                slicing = protocol.get("slicing") or {}  # only slicing has a width
                row.update(
                    width=slicing.get("width"),
                    hidden_size=slicing.get("hidden_size"),
                    timings_s=protocol["timings"],
                    calibration=protocol["calibration"],
                    sweep_job_id=protocol.get("sweep_job_id"),
                )
        elif item["metric"] == "param_fraction_removed":
            row["param_fraction_removed"] = item["value"]
            row["params_before"] = item["protocol"]["params_before"]
            row["params_after"] = item["protocol"]["params_after"]
    return [rows[s] for s in sorted(rows)]


def compare_laws(rows: list[dict[str, Any]], fit: dict[str, Any] | None) -> dict[str, Any]:
    """The strict law on every point, the stored fit's value there, and a held-out check."""
    measured_dense = [row["ppl"] for row in rows if row["sparsity"] == 0.0]
    if measured_dense:
        dense = measured_dense[0]
    elif fit is not None:  # a store kept with --home reuses an earlier job's dense baseline
        dense = float(fit["baseline"])
    else:
        return {"skipped": "no dense row in this job and no fit"}
    pruned = [(row["sparsity"], row["ppl"]) for row in rows if row["sparsity"] > 0.0]
    per_point = []
    calibration = laws.calibrate_ppl(dense, pruned)
    for s, ppl in pruned:
        strict = laws.strict_ppl(dense, s)
        fitted = calibration.chosen.central(s)
        per_point.append(
            {
                "sparsity": s,
                "measured": ppl,
                "strict": strict,
                "strict_rel_error": strict / ppl - 1.0,
                "fitted": fitted,
                "fitted_rel_error": fitted / ppl - 1.0,
            }
        )
    out: dict[str, Any] = {
        "dense_ppl": dense,
        "fit_recomputed_matches_stored": fit is not None and fit["law"] == calibration.chosen.law,
        "per_point": per_point,
    }
    if len(pruned) >= 3:
        train, held = pruned[:2], pruned[2:]
        held_fit = laws.calibrate_ppl(dense, train)
        out["held_out"] = {
            "fitted_on": [s for s, _ in train],
            "law": held_fit.chosen.law,
            "reason": held_fit.reason,
            "points": [
                {
                    "sparsity": s,
                    "measured": ppl,
                    "predicted": (p := held_fit.predict(s)).value,
                    "band": p.band,
                    "rel_error": p.value / ppl - 1.0,
                    "strict_rel_error": laws.strict_ppl(dense, s) / ppl - 1.0,
                }
                for s, ppl in held
            ],
        }
    return out


def summary(report: dict[str, Any]) -> str:
    lines = [
        f"sweep {report.get('job_id')}: {report.get('job', {}).get('status')}, {report['wall_s']} s wall"
    ]
    for row in report.get("results", []):
        lines.append(
            f"  s={row['sparsity']:<4g} ppl={row.get('ppl', float('nan')):9.3f}  "
            f"params removed={row.get('param_fraction_removed', 0.0):+.4f}"
        )
    for fit in report.get("fits", []):
        lines.append(f"  fit: {fit['law']} {fit['params']} ({fit['chosen_reason']})")
        for law, q in fit["quality"].items():
            lines.append(
                f"    {law:7s} R2={q['r2']}  max APE={q['max_ape']:.4f}  mean APE={q['mean_ape']:.4f}"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
