"""The `prunecast` command: run the service (serve, worker, migrate) or talk to one (submit, wait,
predict).

Exit codes of the client commands, for CI:
  0  ok (and every gate passed)
  1  a gate failed: --max-ppl or --max-acc-drop (a gate with nothing to check fails too)
  2  the job failed or was canceled (submit --wait, wait)
  3  usage or connection error, or the server refused the request (4xx, e.g. a 409 for an
     unknown dense baseline; the problem is printed)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from app.cli_client import (
    DEFAULT_SERVER,
    EXIT_GATE_FAILED,
    EXIT_JOB_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    _client,
    _gate_report,
    _print,
)
from app.cli_predict import _predict
from core.methods import DEFAULT_METHOD, DENSE
from core.tasks import ACCURACY_METRICS, SCORE_METRICS


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app.main import create_app
    from core.settings import get_settings

    settings = get_settings()
    uvicorn.run(create_app(settings), host=args.host, port=args.port, log_config=None, access_log=False)
    return EXIT_OK


def _worker(args: argparse.Namespace) -> int:
    """`prunecast worker ...` belongs to the engine side; it is reached by name (core.entrypoints),
    so this client never imports torch."""
    from core.entrypoints import WORKER_COMMAND, resolve

    code: int = resolve(WORKER_COMMAND)(args.worker_args)
    return code


def _migrate(_: argparse.Namespace) -> int:
    from core.migrate import upgrade
    from core.settings import get_settings

    settings = get_settings()
    upgrade(settings.store_url)
    print(f"store at {settings.store_url.split('@')[-1]} is at the newest schema")
    return EXIT_OK


def _import_published(_: argparse.Namespace) -> int:
    from core.published import import_published
    from core.settings import get_settings
    from core.store import Store

    store = Store(get_settings().store_url)
    try:
        with store.session() as session:
            added = import_published(session)
    finally:
        store.dispose()
    for label in added:
        print(f"imported {label}")
    print("every published curve is in the store" if not added else f"{len(added)} curve(s) imported")
    return EXIT_OK


def _wait_until_done(client: Any, job_id: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        remaining = max(1.0, deadline - time.monotonic())
        response = client.get(f"/v1/jobs/{job_id}/wait", params={"timeout": min(remaining, 300.0)})
        response.raise_for_status()
        job: dict[str, Any] = response.json()
        if job["status"] in ("succeeded", "failed", "canceled") or time.monotonic() >= deadline:
            return job


def _job_exit_code(job: dict[str, Any]) -> int:
    return EXIT_OK if job["status"] == "succeeded" else EXIT_JOB_FAILED


def _result_gates(client: Any, results: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """--max-ppl / --max-acc-drop on a finished job's measured results: its pruned results, or all
    of them when it pruned nothing. Accuracy drops are against the model's dense result of the same
    metric and task (from the job, else the newest in the store)."""
    scope = [r for r in results if r["method"] != DENSE] or results
    failures: list[str] = []
    checked: list[str] = []
    if args.max_ppl is not None:
        ppl = [r for r in scope if r["metric"] == "ppl"]
        if not ppl:
            failures.append(f"--max-ppl {args.max_ppl:g}: the job measured no perplexity")
        for r in ppl:
            line = f"ppl of {r['method']} at s = {r['sparsity']:g} is {r['value']:.4g}"
            (failures if r["value"] > args.max_ppl else checked).append(f"{line} (max {args.max_ppl:g})")
    if args.max_acc_drop is not None:
        accuracy = [r for r in scope if r["metric"] in SCORE_METRICS and r["method"] != DENSE]
        if not accuracy:
            failures.append(f"--max-acc-drop {args.max_acc_drop:g}: the job measured no pruned accuracy")
        for r in accuracy:
            dense = _dense_result(client, results, r)
            what = f"{r['metric']} on {r['dataset']} at s = {r['sparsity']:g}"
            if dense is None:
                failures.append(f"{what}: no dense {r['metric']} of {r['model']} to compare with")
                continue
            drop = dense["value"] - r["value"]
            line = f"{what} drops {drop:.4f} (dense {dense['value']:.4f} -> {r['value']:.4f})"
            (failures if drop > args.max_acc_drop else checked).append(f"{line} (max {args.max_acc_drop:g})")
    return _gate_report(failures, checked)


def _dense_result(
    client: Any, results: list[dict[str, Any]], pruned: dict[str, Any]
) -> dict[str, Any] | None:
    for r in results:
        if r["method"] == DENSE and (r["metric"], r["dataset"]) == (pruned["metric"], pruned["dataset"]):
            return r
    params = {"model": pruned["model"], "method": DENSE, "metric": pruned["metric"]}
    response = client.get("/v1/results", params={**params, "dataset": pruned["dataset"], "limit": 1})
    response.raise_for_status()
    items: list[dict[str, Any]] = response.json()["items"]
    return items[0] if items else None


def _read_job(args: argparse.Namespace) -> dict[str, Any]:
    """The job JSON from the argument or --file; ValueError says what is wrong."""
    if args.file:
        text = Path(args.file).read_text()
    elif args.body:
        text = args.body
    else:
        raise ValueError("give the job as JSON text or with --file")
    body: dict[str, Any] = json.loads(text)
    return body


def _submit(args: argparse.Namespace) -> int:
    import httpx

    gated = args.max_ppl is not None or args.max_acc_drop is not None
    if gated and not args.wait:
        print("--max-ppl and --max-acc-drop need --wait", file=sys.stderr)
        return EXIT_USAGE
    try:
        body = _read_job(args)
    except (OSError, ValueError) as error:
        print(f"cannot read the job: {error}", file=sys.stderr)
        return EXIT_USAGE
    try:
        with _client(args) as client:
            headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else {}
            response = client.post("/v1/jobs", json=body, headers=headers)
            if response.status_code >= 400:
                _print(response.json())
                return EXIT_USAGE
            job = response.json()
            if not args.wait:
                _print(job)
                return EXIT_OK
            return _wait_and_gate(client, job["id"], args, gated)
    except (httpx.HTTPError, OSError) as error:
        print(f"cannot reach {args.server}: {error}", file=sys.stderr)
        return EXIT_USAGE


def _wait_and_gate(client: Any, job_id: str, args: argparse.Namespace, gated: bool) -> int:
    """Wait for the job, print it with its results (and gates), and say how it went as an exit code."""
    job = _wait_until_done(client, job_id, args.timeout)
    if job["status"] == "succeeded":
        job["results"] = client.get(f"/v1/jobs/{job_id}/results").json()["items"]
        if gated:
            job["gates"] = _result_gates(client, job["results"], args)
    _print(job)
    if job["status"] != "succeeded":
        return EXIT_JOB_FAILED
    return EXIT_GATE_FAILED if gated and not job["gates"]["passed"] else EXIT_OK


def _wait(args: argparse.Namespace) -> int:
    import httpx

    try:
        with _client(args) as client:
            job = _wait_until_done(client, args.job_id, args.timeout)
            _print(job)
            return _job_exit_code(job)
    except (httpx.HTTPError, OSError) as error:
        print(f"cannot reach {args.server}: {error}", file=sys.stderr)
        return EXIT_USAGE


def _add_gates(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-ppl", type=float, default=None, help="gate: exit 1 when a perplexity exceeds this"
    )
    parser.add_argument(
        "--max-acc-drop",
        type=float,
        default=None,
        help="gate: exit 1 when an accuracy falls more than this below the dense one (a fraction: 0.05)",
    )


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on a usage error, but 2 means a failed job here: usage errors exit 3."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="prunecast", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the API (and, without REDIS_URL, the worker too)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.set_defaults(run=_serve)

    worker = commands.add_parser(
        "worker",
        help="run an RQ worker (needs REDIS_URL; `prunecast worker --help` for its options)",
        add_help=False,
    )
    worker.add_argument("worker_args", nargs=argparse.REMAINDER, help="--burst, --name NAME, --no-preload")
    worker.set_defaults(run=_worker)

    migrate = commands.add_parser("migrate", help="bring the store's schema up to date")
    migrate.set_defaults(run=_migrate)

    published = commands.add_parser(
        "import-published",
        help="store the published pruning curves (core/published.py) as `source: published` results",
    )
    published.set_defaults(run=_import_published)

    for name, handler, helptext in (
        ("submit", _submit, "submit a job (JSON) to a server"),
        ("wait", _wait, "wait for a job to finish"),
    ):
        client = commands.add_parser(name, help=helptext)
        client.add_argument("--server", default=os.environ.get("PRUNECAST_SERVER", DEFAULT_SERVER))
        client.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait at most")
        client.set_defaults(run=handler)
        if name == "submit":
            client.add_argument("body", nargs="?", help='job JSON, e.g. \'{"kind": "evaluate", ...}\'')
            client.add_argument("--file", help="read the job JSON from this file")
            client.add_argument("--wait", action="store_true", help="block until the job ends")
            client.add_argument("--idempotency-key", default=None)
            _add_gates(client)
        else:
            client.add_argument("job_id")

    predict = commands.add_parser(
        "predict",
        help="predict perplexity / accuracy at sparsities (POST /v1/predictions), with CI gates",
        description="Answer from the best rung that can: measured, simulated, profile, law (each with "
        "its band and verdict; --measure-missing queues the jobs that would do better). Exit 0 ok, "
        "1 a gate failed, 3 usage/connection error or a refused request (e.g. 409: the dense baseline "
        "is unknown; the problem names the job that measures it).",
    )
    predict.add_argument("--server", default=os.environ.get("PRUNECAST_SERVER", DEFAULT_SERVER))
    predict.add_argument("--model", required=True, help="model id as stored in results")
    predict.add_argument("--method", default=DEFAULT_METHOD)
    predict.add_argument(
        "--sparsity", type=float, action="append", required=True, help="fraction removed; repeat for more"
    )
    predict.add_argument(
        "--metric", action="append", choices=("ppl", *ACCURACY_METRICS), help="default ppl; repeatable"
    )
    predict.add_argument("--task", action="append", help="task of accuracy metrics, e.g. arc_easy")
    predict.add_argument("--seqlen", type=int, default=None, help="perplexity protocol: window length")
    predict.add_argument("--max-windows", default=None, help="perplexity protocol: a number or `all`")
    predict.add_argument("--points", default=None, help="JSON file with your measured points")
    predict.add_argument(
        "--calibration",
        default=None,
        help='the calibration the prune will use, JSON or @file: {"corpus", "num_sequences", "seqlen", '
        '"seed"}; picks the profile, and the calibration --measure-missing jobs draw',
    )
    predict.add_argument(
        "--precision",
        default=None,
        help="relative 95%% band half width the queued simulation scores to (default 0.02; `all`: every "
        "window)",
    )
    predict.add_argument("--json", action="store_true", help="print the response (and gates) as JSON")
    predict.add_argument(
        "--rung",
        default="best",
        choices=("best", "measured", "simulated", "profile", "law", "strict"),
        help="answer from this rung only (default: the best that can answer)",
    )
    predict.add_argument(
        "--measure-missing", action="store_true", help="queue the jobs that would give a better answer"
    )
    predict.add_argument(
        "--band", action="store_true", help="gate on the band's far end instead of the value"
    )
    _add_gates(predict)
    predict.set_defaults(run=_predict)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:  # its options are the worker's own parser's (workers.cli)
        return _worker(argparse.Namespace(worker_args=argv[1:]))
    args = build_parser().parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
