"""Where pruning breaks on the packaged SmolLM2-135M: multiple-choice accuracy against generative
accuracy, dense and after several prunings, through the service's own jobs.

Usage (from the repository root):

    HF_HUB_OFFLINE=1 .venv/bin/python bench/generative_smollm2.py --cache-dir .prunecast/cache

In the embedded deployment (a migrated SQLite store under `--home`, the app from
`app.main.create_app`, jobs through `POST /v1/jobs` run by the in-process worker), it submits:

1. an `evaluate` job of the dense model: arc_easy, piqa and lambada_openai on the first `--items`
   docs of each (0-shot), and WikiText-2 perplexity;
2. an `evaluate` job of the dense model on the first `--gsm8k-items` GSM8K docs (5-shot, greedy,
   256 tokens), to see whether the dense model is above the task's floor (0);
3. one `prune` job per pruning in `--prunings` (default: Wanda 50 %, SparseGPT 50 %, attention-drop
   8 of 30 branches, SliceGPT s = 0.25) with the same tasks, reusing the dense scores of job 1.

Retained = pruned / dense (for perplexities, dense / pruned, so that 1 is "unchanged" and smaller
is worse in every column). Calibration: `--calibration-sequences` x `--calibration-length` tokens of
the packaged BoolQ passages, seed 42. Writes `bench/out/generative_smollm2.json` after every job.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import time
from typing import Any

import harness
from fastapi.testclient import TestClient

from app.main import create_app

TASKS = ["arc_easy", "piqa", "lambada_openai"]
PRUNINGS = {
    "wanda-50": {"method": "wanda", "sparsity": 0.5},
    "sparsegpt-50": {"method": "sparsegpt", "sparsity": 0.5},
    "attention-drop-8of30": {"method": "attention-drop", "sparsity": 8 / 30},
    "slicegpt-25": {"method": "slicegpt", "sparsity": 0.25},
}
LOWER_IS_BETTER = {"perplexity", "ppl"}


def parse_args() -> argparse.Namespace:
    made = harness.parser(__doc__, "generative_smollm2", threads=1)
    harness.add_model_args(made)
    harness.add_store_args(made, home="optional")
    made.add_argument("--items", type=int, default=300, help="docs per task (the first N)")
    made.add_argument("--gsm8k-items", type=int, default=24, help="0 skips the GSM8K job")
    made.add_argument("--prunings", nargs="*", default=list(PRUNINGS), choices=list(PRUNINGS))
    made.add_argument("--calibration-sequences", type=int, default=64)
    made.add_argument("--calibration-length", type=int, default=512)
    made.add_argument("--eval-windows", type=int, default=8, help="WikiText-2 windows of 512 tokens")
    made.add_argument("--batch-size", type=int, default=16)
    made.add_argument("--poll-s", type=float, default=2.0)
    return made.parse_args()


def main() -> None:
    args = parse_args()
    harness.use_threads(args.threads)
    report = harness.start_report(jobs={})
    accuracy = {"tasks": TASKS, "limit": args.items, "batch_size": args.batch_size}
    perplexity = {"seqlen": 512, "max_windows": args.eval_windows}
    calibration = {
        "corpus": "boolq-passages",
        "num_sequences": args.calibration_sequences,
        "seqlen": args.calibration_length,
    }
    jobs: dict[str, dict[str, Any]] = {
        "dense": {"kind": "evaluate", "model": args.model, "accuracy": accuracy, "perplexity": perplexity}
    }
    if args.gsm8k_items:
        jobs["dense-gsm8k"] = {
            "kind": "evaluate",
            "model": args.model,
            "perplexity": None,
            "accuracy": {"tasks": ["gsm8k"], "limit": args.gsm8k_items, "batch_size": args.batch_size},
        }
    for name in args.prunings:
        jobs[name] = {
            "kind": "prune",
            "model": args.model,
            **PRUNINGS[name],
            "calibration": calibration,
            "perplexity": perplexity,
            "accuracy": accuracy,
            "save_artifact": False,
        }
    with contextlib.ExitStack() as stack:
        settings = harness.kept_or_scratch_store(args, stack, "prunecast-gen-")
        with TestClient(create_app(settings, start_background=False)) as client:
            for name, body in jobs.items():
                report["jobs"][name] = run_job(client, body, args.poll_s)
                report["table"] = table(report["jobs"])
                harness.write_report(args.out, report)
    harness.finish_report(args.out, report)
    print(json.dumps(report["table"], indent=2))


def run_job(client: TestClient, body: dict[str, Any], poll_s: float) -> dict[str, Any]:
    submitted = client.post("/v1/jobs", json=body)
    submitted.raise_for_status()
    job_id, started = submitted.json()["id"], time.perf_counter()
    job = harness.follow(client, job_id, math.inf, poll_s)
    results = client.get(f"/v1/jobs/{job_id}/results").json()["items"]
    return {
        "job_id": job_id,
        "request": body,
        "status": job["status"],
        "error": job["error"],
        "wall_s": round(time.perf_counter() - started, 1),
        "results": [
            {
                key: item[key]
                for key in ("id", "method", "sparsity", "metric", "dataset", "value", "stderr", "n")
            }
            | {
                "elapsed_s": item["protocol"].get("elapsed_s"),
                "examples": item["protocol"].get("examples"),
                "stopped_by": item["protocol"].get("stopped_by"),
            }
            for item in results
        ],
    }


def table(jobs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per model: each (task, metric) with stderr, and retained vs dense."""
    dense: dict[tuple[str, str], float] = {}
    rows = []
    for name, job in jobs.items():
        pruned_method = job["request"].get("method")
        own = [r for r in job["results"] if pruned_method is None or r["method"] != "dense"]
        values = {(r["dataset"], r["metric"]): r for r in own}
        if name == "dense":
            dense = {key: r["value"] for key, r in values.items()}
        row: dict[str, Any] = {"model": name, "wall_s": job["wall_s"], "status": job["status"]}
        for key, r in values.items():
            if r["metric"] == "param_fraction_removed":
                row["param_fraction_removed"] = r["value"]
                continue
            label = f"{key[0]}/{key[1]}"
            row[label] = {"value": r["value"], "stderr": r["stderr"], "n": r["n"]}
            if key in dense and name != "dense" and dense[key]:
                ratio = r["value"] / dense[key]
                row[label]["retained"] = 1 / ratio if key[1] in LOWER_IS_BETTER else ratio
        rows.append(row)
    return rows


if __name__ == "__main__":
    main()
