"""A fanned-out sweep on one RQ worker and on two, side by side: wall time and identical results.

Usage (from the repository root; needs PostgreSQL and Redis as the tests do):

    HF_HUB_OFFLINE=1 .venv/bin/python bench/sweep_workers.py
    HF_HUB_OFFLINE=1 .venv/bin/python bench/sweep_workers.py --method wanda --sparsities 0.2 0.3 0.4 0.5

For each worker count the script creates a scratch PostgreSQL database (dropped after) and its own
queue, starts that many `prunecast worker` processes (one torch thread each: OMP_NUM_THREADS=1),
serves the API in-process, submits one `sweep` with `fan_out: true` on the packaged SmolLM2-135M
and times it from submit to `succeeded`; the dense baseline is measured in both runs (fresh
stores). Small protocol by default: calibration 16 x 256 BoolQ windows, perplexity on the first 4
WikiText-2 windows of 512. Writes bench/out/sweep_workers.json (git-ignored): wall per run, the ratio,
which process ran each child, and whether both runs stored the same values.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import harness
from fastapi.testclient import TestClient

from app.main import create_app
from core.settings import Settings


def run_sweep(workers: int, args: argparse.Namespace) -> dict[str, Any]:
    scratch = tempfile.TemporaryDirectory(prefix="prunecast-bench-")
    with harness.scratch_database() as url, scratch as home:
        settings = Settings(
            home=Path(home),
            database_url=url,
            redis_url=args.redis_url,
            queue_name=f"bench-{uuid.uuid4().hex[:8]}",
            cache_dir=args.cache_dir,
            data_dir=args.data_dir,
            log_format="json",
        )
        env = harness.child_env(args, None) | {
            "DATABASE_URL": url,
            "REDIS_URL": args.redis_url,
            "PRUNECAST_QUEUE_NAME": settings.queue_name,
            "PRUNECAST_HOME": home,
            "OMP_NUM_THREADS": "1",
        }
        logs = [open(Path(home) / f"worker-{i}.log", "wb") for i in range(workers)]  # noqa: SIM115
        processes = [
            subprocess.Popen(
                [sys.executable, "-m", "app.cli", "worker", "--name", f"bench-{i}-{uuid.uuid4().hex[:4]}"],
                env=env,
                cwd=harness.REPO_ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            for i, log in enumerate(logs)
        ]
        try:
            time.sleep(3)  # let the workers connect
            with TestClient(create_app(settings)) as api:
                body = {
                    "kind": "sweep",
                    "model": "smollm2-135m",
                    "method": args.method,
                    "sparsities": args.sparsities,
                    "fan_out": True,
                    "dtype": "float32",
                    "calibration": {
                        "num_sequences": args.calibration_sequences,
                        "seqlen": args.calibration_length,
                    },
                    "perplexity": {"seqlen": 512, "max_windows": args.windows},
                }
                started = time.perf_counter()
                job = api.post("/v1/jobs", json=body).json()
                while True:
                    state = api.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 30}).json()
                    if state["status"] in harness.TERMINAL:
                        break
                wall = time.perf_counter() - started
                if state["status"] != "succeeded":
                    raise RuntimeError(f"sweep {state['status']}: {state.get('error')}")
                children = api.get("/v1/jobs", params={"parent_id": job["id"]}).json()["items"]
                values = {}
                for child in children:
                    for item in api.get(f"/v1/jobs/{child['id']}/results").json()["items"]:
                        values[f"{item['sparsity']:g}/{item['metric']}"] = item["value"]
                return {
                    "workers": workers,
                    "wall_s": round(wall, 2),
                    "children": {
                        f"{child['request']['sparsity']:g}": {
                            "ran_in_sweep_process": child["worker"] == state["worker"],
                            "wall_s": _seconds(child),
                        }
                        for child in children
                    },
                    "values": values,
                    "load_average_end": os.getloadavg(),
                }
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                process.wait(timeout=30)
            for log in logs:
                log.close()


def _seconds(job: dict[str, Any]) -> float | None:
    from datetime import datetime

    if not job.get("started_at") or not job.get("finished_at"):
        return None
    started, finished = (datetime.fromisoformat(job[key]) for key in ("started_at", "finished_at"))
    return round((finished - started).total_seconds(), 2)


def main() -> None:
    parser = harness.parser(__doc__, "sweep_workers", threads=None)
    harness.add_store_args(parser)
    parser.add_argument("--method", default="wanda")
    parser.add_argument("--sparsities", nargs="*", type=float, default=[0.2, 0.3, 0.4, 0.5])
    parser.add_argument("--calibration-sequences", type=int, default=16)
    parser.add_argument("--calibration-length", type=int, default=256)
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    result = harness.start_report(
        with_torch=False,
        model="smollm2-135m",
        method=args.method,
        sparsities=args.sparsities,
        protocol={
            "calibration": [args.calibration_sequences, args.calibration_length],
            "windows": args.windows,
            "seqlen": 512,
        },
        runs=[],
    )
    for workers in (1, 2):
        run = run_sweep(workers, args)
        print(json.dumps({key: run[key] for key in ("workers", "wall_s", "children")}), flush=True)
        result["runs"].append(run)
    one, two = result["runs"]
    result["two_over_one_wall"] = round(two["wall_s"] / one["wall_s"], 3)
    result["identical_values"] = one["values"] == two["values"]
    harness.finish_report(args.out, result)
    print(json.dumps({key: result[key] for key in ("two_over_one_wall", "identical_values")}, indent=2))


if __name__ == "__main__":
    main()
