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
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402
import transformers  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from app.main import create_app  # noqa: E402
from core.migrate import upgrade  # noqa: E402
from core.prediction import laws  # noqa: E402
from core.settings import Settings  # noqa: E402

TERMINAL = ("succeeded", "failed", "canceled")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m", help="packaged alias or local folder")
    parser.add_argument("--method", default="slicegpt", help="any pruning method a sweep takes")
    parser.add_argument("--sparsities", type=float, nargs="+", default=[0.0, 0.1, 0.2, 0.3, 0.4])
    parser.add_argument("--calibration-sequences", type=int, default=32)
    parser.add_argument("--calibration-length", type=int, default=256)
    parser.add_argument("--calibration-batch", type=int, default=8)
    parser.add_argument("--calibration-corpus", default="boolq-passages", help="a packaged corpus")
    parser.add_argument("--calibration-seed", type=int, default=None, help="default: the job's seed, 42")
    parser.add_argument("--eval-seqlen", type=int, default=512)
    parser.add_argument("--eval-windows", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(os.environ.get("PRUNECAST_CACHE_DIR", REPO_ROOT / ".prunecast" / "cache")),
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path(os.environ.get("PRUNECAST_DATA_DIR", REPO_ROOT.parent / "shared" / "data")),
    )
    parser.add_argument(
        "--model-root", type=Path, action="append", default=[], help="allow local model folders below this"
    )
    parser.add_argument(
        "--home",
        type=Path,
        default=None,
        help="keep the store here (SQLite, migrated) so later benches read its results; default: a "
        "temporary folder, deleted at the end",
    )
    parser.add_argument("--poll-s", type=float, default=2.0)
    parser.add_argument("--timeout-s", type=float, default=4 * 3600)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "out" / "sweep_smollm2.json")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    cpu_started, wall_started = time.process_time(), time.perf_counter()
    report: dict[str, Any] = {
        "load_average_start": list(os.getloadavg()),
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "torch_threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
        },
    }
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
        "perplexity": {"seqlen": args.eval_seqlen, "max_windows": args.eval_windows},
    }
    report["request"] = body
    with contextlib.ExitStack() as stack:
        home = args.home or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="prunecast-sweep-")))
        home.mkdir(parents=True, exist_ok=True)
        settings = Settings(
            home=home,
            cache_dir=args.cache_dir,
            data_dir=args.data_dir,
            model_roots=args.model_root,
            log_format="console",
        )
        upgrade(settings.store_url)
        with TestClient(create_app(settings, start_background=False)) as client:
            run_job(client, body, args, report)
    report["wall_s"] = round(time.perf_counter() - wall_started, 2)
    report["cpu_s"] = round(time.process_time() - cpu_started, 2)
    report["load_average_end"] = list(os.getloadavg())
    write(args.out, report)
    print(summary(report))


def run_job(
    client: TestClient, body: dict[str, Any], args: argparse.Namespace, report: dict[str, Any]
) -> None:
    submitted = client.post("/v1/jobs", json=body)
    submitted.raise_for_status()
    job_id = submitted.json()["id"]
    report["job_id"] = job_id
    progress: list[dict[str, Any]] = []  # every distinct (stage, detail) seen while polling
    started = time.perf_counter()
    while True:
        job = client.get(f"/v1/jobs/{job_id}").json()
        seen = (job["stage"], job["detail"])
        if not progress or (progress[-1]["stage"], progress[-1]["detail"]) != seen:
            progress.append(
                {
                    "t_s": round(time.perf_counter() - started, 1),
                    "stage": job["stage"],
                    "progress": round(job["progress"], 4),
                    "detail": job["detail"],
                }
            )
            print(f"[{progress[-1]['t_s']:8.1f}s] {job['stage']}: {job['detail']}", flush=True)
        if job["status"] in TERMINAL or time.perf_counter() - started > args.timeout_s:
            break
        time.sleep(args.poll_s)
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


def write(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
