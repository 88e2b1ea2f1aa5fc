"""Task scores to a precision on a real model: what pairing the docs with the dense model's record buys
a simulation's task scores, and whether its band holds the every-doc score.

Usage (from the repository root; a fresh store under --home, the app in-process):

    HF_HUB_OFFLINE=1 .venv/bin/python bench/paired_tasks.py --home bench/out/paired-tasks

Steps, side by side in one run on one store (defaults: SmolLM2-135M, arc_easy's first 1000 test docs
0-shot, Wanda at s = 0.2, 0.4, 0.6, calibration 32 x 512 BoolQ passages, perplexity on
4 windows of 512 scored in full so that only the tasks differ):

1. `evaluate` with the tasks: the dense score and its right-or-wrong record on every doc;
2. `simulate` with `accuracy.precision` null: every sparsity scored on every doc (the truth here);
3. the same `simulate` with the default precision (0.02): docs in the seeded order, paired.

For each sparsity and metric: docs used, |estimate - every-doc score| in accuracy points, whether the
95 % band held the every-doc score, and each job's task-scoring time (`timings.accuracy_s`). Writes
bench/out/paired_tasks.json (git-ignored) after every job.
"""

from __future__ import annotations

import argparse
from typing import Any

import harness
from fastapi.testclient import TestClient

from app.main import create_app
from core.prediction.paired_docs import DEFAULT_DOC_PRECISION


def parse_args() -> argparse.Namespace:
    made = harness.parser(__doc__, "paired_tasks")
    harness.add_store_args(made, home="required")
    harness.add_model_args(made)
    harness.add_calibration_args(made, sequences=32, length=512)
    made.add_argument("--method", default="wanda")
    made.add_argument("--sparsities", type=float, nargs="+", default=[0.2, 0.4, 0.6])
    made.add_argument("--tasks", nargs="+", default=["arc_easy"])
    made.add_argument("--limit", type=int, default=1000, help="the first N docs of each task")
    made.add_argument("--precision", type=float, default=DEFAULT_DOC_PRECISION)
    made.add_argument("--timeout-s", type=float, default=4 * 3600.0)
    return made.parse_args()


def accuracy(args: argparse.Namespace, precision: float | None) -> dict[str, Any]:
    return {"tasks": args.tasks, "limit": args.limit, "batch_size": 16, "precision": precision}


def simulate_body(args: argparse.Namespace, precision: float | None) -> dict[str, Any]:
    return {
        "kind": "simulate",
        "model": args.model,
        "method": args.method,
        "dtype": "float32",
        "sparsities": args.sparsities,
        "anchors": [],
        "calibration": harness.calibration_body(args),
        "perplexity": {"seqlen": 512, "max_windows": 4, "precision": None},
        "accuracy": accuracy(args, precision),
    }


def scores(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """'<task>/<metric>@<s>' -> value, stderr and the docs it rests on."""
    found = {}
    for row in job["rows"]:
        if row["metric"] == "ppl" or row["source"] != "simulated":
            continue
        paired = (row["protocol"].get("paired_docs") or {}).get(row["metric"])
        found[f"{row['dataset']}/{row['metric']}@{row['sparsity']:g}"] = {
            "value": row["value"],
            "stderr": row["stderr"],
            "docs": row["n"] if paired is None else paired["docs"],
            "of_docs": row["n"] if paired is None else paired["of_docs"],
            "band": None if paired is None else [paired["low"], paired["high"]],
        }
    return found


def accuracy_seconds(job: dict[str, Any]) -> float | None:
    timings = [r["protocol"].get("timings", {}) for r in job["rows"] if r["metric"] == "ppl"]
    return next((t["accuracy_s"] for t in timings if "accuracy_s" in t), None)


def compare(every: dict[str, dict[str, Any]], paired: dict[str, dict[str, Any]]) -> dict[str, Any]:
    rows = {}
    for key, truth in every.items():
        found = paired[key]
        band = found["band"]
        rows[key] = {
            "every_doc": truth["value"],
            "paired": found["value"],
            "docs": f"{found['docs']} of {found['of_docs']}",
            "error_points": round(100 * abs(found["value"] - truth["value"]), 2),
            "band_holds": None if band is None else band[0] <= truth["value"] <= band[1],
        }
    return rows


def main() -> None:
    args = parse_args()
    settings = harness.embedded_store(args)
    report = harness.start_report(model=args.model, method=args.method, tasks=args.tasks, limit=args.limit)
    with TestClient(create_app(settings, start_background=False)) as client:
        dense = {
            "kind": "evaluate",
            "model": args.model,
            "dtype": "float32",
            "perplexity": None,
            "accuracy": accuracy(args, None),
        }
        report["dense"] = {"wall_s": harness.submit(client, dense, args.timeout_s)["wall_s"]}
        harness.write_report(args.out, report)
        jobs = {}
        for name, precision in (("every_doc", None), ("paired", args.precision)):
            jobs[name] = harness.submit(client, simulate_body(args, precision), args.timeout_s)
            report[name] = {
                "wall_s": jobs[name]["wall_s"],
                "accuracy_s": accuracy_seconds(jobs[name]),
                "scores": scores(jobs[name]),
            }
            harness.write_report(args.out, report)
    report["comparison"] = compare(report["every_doc"]["scores"], report["paired"]["scores"])
    harness.finish_report(args.out, report)
    for key, row in report["comparison"].items():
        print(key, row)
    print(
        "task scoring s: every doc",
        report["every_doc"]["accuracy_s"],
        "paired",
        report["paired"]["accuracy_s"],
    )


if __name__ == "__main__":
    main()
