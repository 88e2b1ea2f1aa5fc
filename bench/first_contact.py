"""The first contact, as a new user meets it: a packaged model nobody has pruned, asked "what will
slicing it to s do to its perplexity?", step by step, and each step's answer scored against the
curve measured afterwards.

Usage (from the repository root; a fresh store under --home, the app in-process with its embedded
worker, as `make run` serves it):

    HF_HUB_OFFLINE=1 .venv/bin/python bench/first_contact.py --home bench/out/first-contact

Steps (defaults: the protocol of issue 32: calibration 64 x 1024 BoolQ passages, seed 7; WikiText-2
at seqlen 1024 over 30 windows; s = 0.15, 0.25, 0.35, 0.45):

1. `POST /v1/predictions` on the empty store: the 409 and the job it names;
2. the same with `measure_missing: true`: the 202 and the job it queued, run to the end (its wall time);
3. the same again: the answer (rung, value, band, verdict) at every sparsity;
4. a `sweep` of the same method, calibration and protocol: the truth;
5. the answer once the store holds the sweep (the measured rung, and the simulated rung's record);
6. the caller-point case: only the dense value and the measured point at `--caller-point` sent as
   `points`, every rung's answer at the other sparsities (the law rung's band must cover the truth
   or say it cannot).

Every answer is scored by |ln(answer / measured)|, and each band is checked for the truth. Writes
bench/out/first_contact.json (git-ignored) and prints a summary.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import harness
from fastapi.testclient import TestClient

from app.main import create_app


def parse_args() -> argparse.Namespace:
    made = harness.parser(__doc__, "first_contact")
    harness.add_store_args(made, home="required")
    harness.add_model_args(made)
    harness.add_calibration_args(made, sequences=64, length=1024, seed=7)
    harness.add_protocol_args(made, seqlen=1024, windows=30)
    made.add_argument("--method", default="slicegpt")
    made.add_argument("--sparsities", type=float, nargs="+", default=[0.15, 0.25, 0.35, 0.45])
    made.add_argument("--caller-point", type=float, default=0.25)
    made.add_argument("--timeout-s", type=float, default=7200.0)
    return made.parse_args()


def main() -> None:
    args = parse_args()
    settings = harness.embedded_store(args)
    report = harness.start_report(request=question(args))
    with TestClient(create_app(settings, start_background=False)) as client:
        steps = report["steps"] = {}
        first = client.post("/v1/predictions", json=question(args))
        steps["1_empty_store"] = {"status": first.status_code, "body": first.json()}
        queued = client.post("/v1/predictions", json={**question(args), "measure_missing": True})
        job = queued.json().get("job") or {}
        steps["2_measure_missing"] = {
            "status": queued.status_code,
            "job_id": job.get("id"),
            "kind": job.get("kind"),
        }
        if queued.status_code == 202:
            steps["2_measure_missing"]["job"] = harness.run(client, job["id"], args.timeout_s)
        steps["3_after_simulation"] = answer(client, question(args))
        harness.write_report(args.out, report)
        sweep = {
            "kind": "sweep",
            "model": args.model,
            "method": args.method,
            "sparsities": args.sparsities,
            "calibration": question(args)["calibration"],
            "perplexity": harness.protocol_body(args),
        }
        submitted = client.post("/v1/jobs", json=sweep)
        submitted.raise_for_status()
        steps["4_sweep"] = harness.run(client, submitted.json()["id"], args.timeout_s)
        truth = measured_curve(client, submitted.json()["id"])
        truth["0"] = steps["3_after_simulation"]["baseline"]  # the sweep reused the simulation's
        report["truth"] = truth
        steps["5_after_sweep"] = answer(client, question(args))
        dense = truth["0"]
        points = [
            {"metric": "ppl", "sparsity": 0.0, "value": dense},
            {"metric": "ppl", "sparsity": args.caller_point, "value": truth[key(args.caller_point)]},
        ]
        steps["6_caller_point"] = answer(client, {**question(args), "points": points})
    for step in ("3_after_simulation", "5_after_sweep", "6_caller_point"):
        score(report["steps"][step], truth)
    harness.finish_report(args.out, report)
    print(summary(report))


def question(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "model": args.model,
        "method": args.method,
        "sparsities": args.sparsities,
        "protocol": {"seqlen": args.eval_seqlen, "max_windows": args.eval_windows},
        "calibration": {
            "corpus": args.calibration_corpus,
            "num_sequences": args.calibration_sequences,
            "seqlen": args.calibration_length,
            "seed": args.calibration_seed,
        },
    }


def key(sparsity: float) -> str:
    return f"{sparsity:g}"


def measured_curve(client: TestClient, job_id: str) -> dict[str, float]:
    rows = client.get(f"/v1/jobs/{job_id}/results", params={"limit": 200}).json()["items"]
    return {
        key(r["sparsity"]): r["value"] for r in rows if r["metric"] == "ppl" and r["source"] == "measured"
    }


def answer(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/predictions", json=body)
    if response.status_code != 200:
        return {"status": response.status_code, "body": response.json()}
    [ppl] = [m for m in response.json()["metrics"] if m["metric"] == "ppl"]
    return {
        "status": 200,
        "baseline": ppl["baseline"]["value"],
        "missing": [j["kind"] for j in ppl["missing"]],
        "answers": [
            {
                "sparsity": p["sparsity"],
                "value": p["value"],
                "band": p["band"],
                "rung": p["rung"],
                "predictor": p["predictor"],
                "verdict": p["verdict"],
                "alternatives": [
                    {k: a[k] for k in ("rung", "value", "band", "predictor", "why_not")}
                    | {"verdict": a["verdict"]["level"]}
                    for a in p["alternatives"]
                ],
            }
            for p in ppl["predictions"]
        ],
    }


def score(step: dict[str, Any], truth: dict[str, float]) -> None:
    """Each answer's and each alternative's |ln| miss against the truth, and whether its band held it."""
    for item in step.get("answers", []):
        measured = truth.get(key(item["sparsity"]))
        if measured is None:
            continue
        item["truth"] = measured
        for entry in [item, *item["alternatives"]]:
            value, band = entry["value"], entry["band"]
            entry["log_error"] = None if not value else abs(math.log(value / measured))
            entry["covered"] = None if not band or None in band else band[0] <= measured <= band[1]


def summary(report: dict[str, Any]) -> str:
    lines = [f"truth: {report['truth']}"]
    for name, step in report["steps"].items():
        if "answers" not in step:
            lines.append(
                f"{name}: HTTP {step.get('status')} {step.get('kind') or ''} {step.get('job') or ''}"
            )
            continue
        lines.append(f"{name}:")
        for a in step["answers"]:
            miss = a.get("log_error")
            lines.append(
                f"  s={a['sparsity']:g} {a['rung']}: {a['value']} band {a['band']} "
                f"({a['verdict']['level'] if a['verdict'] else '-'}) "
                + ("" if miss is None else f"miss x{math.exp(miss):.3f} covered {a.get('covered')}")
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
