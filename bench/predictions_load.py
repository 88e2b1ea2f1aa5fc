"""Load test of POST /v1/predictions on PostgreSQL: latency percentiles and throughput (issue 5).

Usage (from the repository root; needs PostgreSQL on 127.0.0.1:5432 as for `make test`):

    .venv/bin/python bench/predictions_load.py                      # 1 and 2 uvicorn workers, 10 s runs
    .venv/bin/python bench/predictions_load.py --workers 1 --duration 5 --connections 1 8

What it does, all on loopback and bounded in time:

1. creates a scratch database (like tests/conftest.py), migrates it, and seeds the store with the
   model under test (a dense and three pruned perplexities, SliceGPT's OPT-125M numbers, and a
   succeeded simulation of it) among `--background-models` other models with the same five results
   each, so the query has an index to use and rows to skip, twelve of them with a fitted curve so
   the records and priors have curves to read; the database is dropped at the end, whatever happens;
2. serves the API with uvicorn in a subprocess (`app.main:create_app --factory`, `--workers N`,
   uvloop + httptools, no access log, no embedded worker thread);
3. drives it from a second process with `wrk` (a C load generator: its own CPU cost on the shared
   2 cores is small) and a Lua script that POSTs the body, for `--duration` seconds per run at
   each `--connections` level, after a short warm-up; without wrk, an asyncio httpx client sends a
   fixed number of requests instead (slower, so its numbers are a lower bound);
4. runs the same load on three endpoints: `GET /healthz` (the framework's floor: no store, no
   work), `POST /v1/predictions` with the caller's points (the laws, no store), and with the
   store's points (the real path: one indexed query plus the laws).

Writes bench/out/predictions_load.json (git-ignored) and prints it: per worker count, endpoint and
connection count: requests, errors (non-2xx and socket errors), requests/s, p50/p90/p99/max in ms;
plus the targets (p50 < 5 ms, >= 500 req/s; issue 32: store-point predictions at least 0.5x the
/healthz throughput of the same run, p99 under 20 ms at 8 connections), versions, CPU count and load
averages at start and end.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import harness

from core.prediction.anchoring import SIMULATED_ROLE
from core.prediction.fits import MeasuredPoint, ppl_fit
from core.store import Store
from core.tables import SIMULATED_SOURCE, Job, JobStatus, Result

MODEL = "facebook/opt-125m"
TARGET_P50_MS = 5.0
TARGET_RPS = 500.0
TARGET_HEALTHZ_RATIO = 0.5  # predictions (store) / healthz throughput, same workers and connections
TARGET_P99_MS_AT_8 = 20.0
DENSE, PRUNED = 27.64, ((0.10, 29.33), (0.20, 34.53), (0.30, 44.61))
PROTOCOL = {"seqlen": 2048, "requested_seqlen": 2048, "max_windows": 4, "windows": 4, "dtype": "float32"}

STORE_BODY = {"model": MODEL, "method": "slicegpt", "sparsities": [0.25, 0.3]}
CALLER_BODY = {
    **STORE_BODY,
    "points": [{"metric": "ppl", "sparsity": 0.0, "value": DENSE}]
    + [{"metric": "ppl", "sparsity": s, "value": v} for s, v in PRUNED],
}

WRK_SCRIPT = """
wrk.method = "{method}"
wrk.body = {body}
wrk.headers["Content-Type"] = "application/json"
done = function(summary, latency, requests)
  local errors = summary.errors.connect + summary.errors.read + summary.errors.write
    + summary.errors.timeout + summary.errors.status
  io.write(string.format(
    'WRK_JSON {{"requests": %d, "duration_us": %d, "errors": %d, "non_2xx": %d, '
    .. '"p50_us": %d, "p90_us": %d, "p99_us": %d, "max_us": %d, "mean_us": %.1f}}\\n',
    summary.requests, summary.duration, errors, summary.errors.status,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean))
end
"""


def lua_string(text: str) -> str:
    return "[==[" + text + "]==]"


# ------------------------------------------------------------------------------------------ the store


def seed(url: str, background_models: int, curves: int = 12) -> int:
    """Results of every model, a fitted curve (a sweep's `fits` row) for `curves` of them, and a
    succeeded simulation of the model under test: every rung's record has something to read."""
    store = Store(url)
    rows = []
    for index in range(background_models + 1):
        model = MODEL if index == 0 else f"bench-org/model-{index:04d}"
        rows.append((model, "dense", 0.0, "ppl", DENSE))
        rows += [(model, "slicegpt", s, "ppl", v) for s, v in PRUNED]
        rows.append((model, "slicegpt", 0.3, "param_fraction_removed", 0.31))  # a row to skip
    with store.session() as session:
        session.add_all(
            Result(
                model_id=model,
                method=method,
                sparsity=s,
                metric=metric,
                dataset="wikitext2" if metric == "ppl" else "none",
                value=value,
                source="measured",
                protocol={**PROTOCOL, "calibration": {"num_sequences": 128, "seed": 42}},
            )
            for model, method, s, metric, value in rows
        )
        for index in range(1, min(curves, background_models) + 1):
            slope = 1.0 + 0.05 * index  # each model its own sensitivity
            points = [MeasuredPoint(s, DENSE ** (1 / (1 - slope * s))) for s, _ in PRUNED]
            session.add(
                ppl_fit(
                    model_id=f"bench-org/model-{index:04d}",
                    model_revision=None,
                    method="slicegpt",
                    dataset="wikitext2",
                    protocol={**PROTOCOL, "calibration": {"num_sequences": 128, "seed": 42}},
                    dense=MeasuredPoint(0.0, DENSE),
                    points=points,
                )
            )
        job = Job(
            kind="simulate", status=JobStatus.succeeded, request={}, model_id=MODEL, request_hash="bench"
        )
        session.add(job)
        session.flush()
        session.add_all(
            Result(
                job_id=job.id,
                model_id=MODEL,
                method="slicegpt",
                sparsity=s,
                metric="ppl",
                dataset="wikitext2",
                value=value * 1.02,
                source=SIMULATED_SOURCE,
                protocol={
                    **PROTOCOL,
                    "calibration": {"num_sequences": 128, "seed": 42},
                    "simulation": {"role": SIMULATED_ROLE, "engine": "projection", "exact": False},
                    "band": {"low": value * 0.99, "high": value * 1.05, "level": 0.95},
                },
            )
            for s, value in PRUNED
        )
    store.dispose()
    return len(rows)


# ---------------------------------------------------------------------------------------- the server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def api_server(url: str, workers: int, log_path: Path) -> Iterator[str]:
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "PRUNECAST_HOME": tempfile.mkdtemp(prefix="prunecast-bench-"),
        "PRUNECAST_EMBEDDED_WORKER": "false",
        "PRUNECAST_LOG_LEVEL": "WARNING",
    }
    env.pop("REDIS_URL", None)
    command = [
        sys.executable, "-m", "uvicorn", "app.main:create_app", "--factory",
        "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers),
        "--no-access-log", "--log-level", "warning",
    ]  # fmt: skip
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            command,
            cwd=harness.REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, process)
        yield base
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)


def wait_ready(base: str, process: subprocess.Popen[bytes]) -> None:
    import httpx

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the API exited with {process.returncode}; see the log")
        try:
            if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the API did not become ready in 60 s")


# --------------------------------------------------------------------------------------------- load


def run_wrk(
    base: str, path: str, body: dict[str, Any] | None, connections: int, duration: float
) -> dict[str, Any]:
    method = "GET" if body is None else "POST"
    script = WRK_SCRIPT.format(method=method, body=lua_string(json.dumps(body)) if body else "nil")
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as handle:
        handle.write(script)
    try:
        command = [
            "wrk", "-t", "1", "-c", str(connections), "-d", f"{duration:g}s", "--timeout", "5s",
            "-s", handle.name, f"{base}{path}",
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=duration + 60)
    finally:
        os.unlink(handle.name)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("WRK_JSON ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no summary: {done.stdout}\n{done.stderr}")
    raw = json.loads(line.removeprefix("WRK_JSON "))
    seconds = raw["duration_us"] / 1e6
    return {
        "tool": "wrk",
        "requests": raw["requests"],
        "errors": raw["errors"],
        "non_2xx": raw["non_2xx"],
        "seconds": round(seconds, 3),
        "rps": round(raw["requests"] / seconds, 1),
        "p50_ms": raw["p50_us"] / 1000,
        "p90_ms": raw["p90_us"] / 1000,
        "p99_ms": raw["p99_us"] / 1000,
        "max_ms": raw["max_us"] / 1000,
        "mean_ms": round(raw["mean_us"] / 1000, 3),
    }


def run_httpx(
    base: str, path: str, body: dict[str, Any] | None, connections: int, requests: int
) -> dict[str, Any]:
    """Fallback without wrk: `connections` concurrent clients share a fixed number of requests."""
    import httpx

    latencies: list[float] = []
    errors = 0

    async def client(count: int) -> None:
        nonlocal errors
        async with httpx.AsyncClient(base_url=base, timeout=5.0) as http:
            for _ in range(count):
                start = time.perf_counter()
                try:
                    response = await (http.get(path) if body is None else http.post(path, json=body))
                    ok = 200 <= response.status_code < 300
                except httpx.HTTPError:
                    ok = False
                latencies.append(time.perf_counter() - start)
                errors += not ok

    async def main() -> float:
        start = time.perf_counter()
        share = [requests // connections + (i < requests % connections) for i in range(connections)]
        await asyncio.wait_for(asyncio.gather(*(client(n) for n in share)), timeout=300)
        return time.perf_counter() - start

    seconds = asyncio.run(main())
    ordered = sorted(latencies)

    def pct(q: float) -> float:
        return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

    return {
        "tool": "httpx",
        "requests": len(ordered),
        "errors": errors,
        "non_2xx": errors,
        "seconds": round(seconds, 3),
        "rps": round(len(ordered) / seconds, 1),
        "p50_ms": pct(0.50),
        "p90_ms": pct(0.90),
        "p99_ms": pct(0.99),
        "max_ms": round(1000 * ordered[-1], 3),
        "mean_ms": round(1000 * sum(ordered) / len(ordered), 3),
    }


ENDPOINTS: dict[str, tuple[str, dict[str, Any] | None]] = {
    "healthz (floor)": ("/healthz", None),
    "predictions, caller points": ("/v1/predictions", CALLER_BODY),
    "predictions, store points": ("/v1/predictions", STORE_BODY),
}


def check_answers(base: str) -> dict[str, Any]:
    """One request of each kind, to prove the load hits the real path and to record its answer."""
    import httpx

    out = {}
    for name, body in (("store", STORE_BODY), ("caller", CALLER_BODY)):
        response = httpx.post(f"{base}/v1/predictions", json=body, timeout=10)
        response.raise_for_status()
        metric = response.json()["metrics"][0]
        out[name] = {
            "source": metric["source"],
            "rung": metric["predictions"][0]["rung"],
            "verdict": (metric["predictions"][0]["verdict"] or {}).get("level"),
            "value_at_0.25": metric["predictions"][0]["value"],
            "response_bytes": len(response.content),
        }
    return out


def healthz_ratios(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Store-point predictions' throughput over /healthz's, per (workers, connections) run side by side."""
    floor = {(r["workers"], r["connections"]): r["rps"] for r in runs if r["endpoint"] == "healthz (floor)"}
    return {
        f"workers={r['workers']} c={r['connections']}": round(
            r["rps"] / floor[(r["workers"], r["connections"])], 3
        )
        for r in runs
        if r["endpoint"] == "predictions, store points" and floor.get((r["workers"], r["connections"]))
    }


def service_versions() -> dict[str, Any]:
    """The versions that set the service's speed, beside the harness's machine facts."""
    import fastapi
    import pydantic
    import sqlalchemy
    import uvicorn

    versions = (fastapi, pydantic, sqlalchemy, uvicorn)
    return {module.__name__: module.__version__ for module in versions}


def main() -> int:
    parser = harness.parser(__doc__, "predictions_load", threads=None)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="uvicorn worker counts")
    parser.add_argument(
        "--connections", type=int, nargs="+", default=[1, 2, 8], help="concurrent connections"
    )
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per wrk run (max 60)")
    parser.add_argument("--requests", type=int, default=3000, help="requests per run without wrk")
    parser.add_argument("--background-models", type=int, default=200)
    parser.add_argument(
        "--pg-admin-url",
        default=harness.PG_ADMIN_URL,
    )
    args = parser.parse_args()
    duration = min(max(args.duration, 1.0), 60.0)
    wrk = shutil.which("wrk")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    log_path = args.out.with_suffix(".server.log")
    report = harness.start_report(
        with_torch=False,
        targets={"p50_ms": TARGET_P50_MS, "rps": TARGET_RPS},
        load_tool="wrk" if wrk else "httpx (wrk not found: apt-get install wrk)",
        duration_s_per_run=duration if wrk else None,
        requests_per_run=None if wrk else args.requests,
        versions=service_versions(),
        runs=[],
    )
    with harness.scratch_database(args.pg_admin_url) as url:
        report["seeded_rows"] = seed(url, args.background_models)
        for workers in args.workers:
            with api_server(url, workers, log_path) as base:
                report.setdefault("answers", check_answers(base))
                for name, (path, body) in ENDPOINTS.items():
                    for connections in args.connections:
                        if wrk:
                            run_wrk(base, path, body, connections, min(2.0, duration))  # warm-up
                            result = run_wrk(base, path, body, connections, duration)
                        else:
                            run_httpx(base, path, body, connections, min(300, args.requests))
                            result = run_httpx(base, path, body, connections, args.requests)
                        entry = {"workers": workers, "endpoint": name, "connections": connections, **result}
                        report["runs"].append(entry)
                        print(
                            f"workers={workers} {name:28s} c={connections:<3d} {result['rps']:8.1f} req/s  "
                            f"p50 {result['p50_ms']:6.2f} ms  p90 {result['p90_ms']:6.2f}  "
                            f"p99 {result['p99_ms']:6.2f}  errors {result['errors']}",
                            file=sys.stderr,
                        )
    store_runs = [r for r in report["runs"] if r["endpoint"] == "predictions, store points"]
    report["summary"] = {
        "best_rps_store": max((r["rps"] for r in store_runs), default=None),
        "p50_ms_store_1_connection": min(
            (r["p50_ms"] for r in store_runs if r["connections"] == 1), default=None
        ),
        "meets_targets": any(r["rps"] >= TARGET_RPS and r["p50_ms"] < TARGET_P50_MS for r in store_runs),
        "healthz_ratio": healthz_ratios(report["runs"]),
        "p99_ms_store_8_connections": [r["p99_ms"] for r in store_runs if r["connections"] == 8],
        "targets_issue_32": {
            "healthz_ratio_min": TARGET_HEALTHZ_RATIO,
            "p99_ms_at_8_max": TARGET_P99_MS_AT_8,
        },
    }
    harness.finish_report(args.out, report)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
