"""The `prunecast` command: run the service (serve, worker, migrate) or talk to one (submit, wait).

Exit codes of the client commands: 0 ok, 2 the job failed or was canceled, 3 usage or
connection error (and 1 is kept for CI gates that fail).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

EXIT_OK = 0
EXIT_GATE_FAILED = 1
EXIT_JOB_FAILED = 2
EXIT_USAGE = 3

DEFAULT_SERVER = "http://127.0.0.1:8000"


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app.config import get_settings
    from app.main import create_app

    settings = get_settings()
    uvicorn.run(create_app(settings), host=args.host, port=args.port, log_config=None, access_log=False)
    return EXIT_OK


def _worker(args: argparse.Namespace) -> int:
    from redis import Redis
    from rq import Queue, Worker

    from app.config import get_settings
    from app.logs import configure_logging

    settings = get_settings()
    configure_logging(settings)
    if not settings.redis_url:
        print(
            "prunecast worker needs REDIS_URL; without it `prunecast serve` runs jobs itself", file=sys.stderr
        )
        return EXIT_USAGE
    connection = Redis.from_url(settings.redis_url)
    queue = Queue(settings.queue_name, connection=connection)
    if args.preload:
        _preload_engine()
    # The forking Worker runs each job in a fresh child (the "work horse"). This parent may import
    # torch but never initialises CUDA, so CUDA only ever starts in a child that does not fork again.
    worker = Worker([queue], connection=connection, name=args.name)
    worker.work(burst=args.burst, with_scheduler=False, logging_level=settings.log_level.upper())
    return EXIT_OK


def _preload_engine() -> None:
    """Import the engine once in the parent so each forked job starts in milliseconds, not seconds.

    Importing torch and transformers does not initialise CUDA; checked here so that a future
    import that does would fail loudly instead of breaking CUDA in every forked child.
    """
    import importlib

    import torch

    from workers.kinds import HANDLER_MODULES

    for module in HANDLER_MODULES.values():
        importlib.import_module(module)
    if torch.cuda.is_initialized():
        raise RuntimeError("preloading the engine initialised CUDA; run the worker with --no-preload")


def _migrate(_: argparse.Namespace) -> int:
    from app.config import get_settings
    from app.migrate import upgrade

    settings = get_settings()
    upgrade(settings.store_url)
    print(f"store at {settings.store_url.split('@')[-1]} is at the newest schema")
    return EXIT_OK


def _client(args: argparse.Namespace) -> Any:
    import httpx

    headers = {"Accept": "application/json"}
    token = os.environ.get("PRUNECAST_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.Client(base_url=args.server, headers=headers, timeout=httpx.Timeout(30.0, read=None))


def _print(body: Any) -> None:
    print(json.dumps(body, indent=2, sort_keys=True))


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


def _submit(args: argparse.Namespace) -> int:
    import httpx

    try:
        if args.file:
            body = json.loads(Path(args.file).read_text())
        elif args.body:
            body = json.loads(args.body)
        else:
            print("give the job as JSON text or with --file", file=sys.stderr)
            return EXIT_USAGE
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
            if args.wait:
                job = _wait_until_done(client, job["id"], args.timeout)
                if job["status"] == "succeeded":
                    job["results"] = client.get(f"/v1/jobs/{job['id']}/results").json()["items"]
            _print(job)
            return _job_exit_code(job) if args.wait else EXIT_OK
    except (httpx.HTTPError, OSError) as error:
        print(f"cannot reach {args.server}: {error}", file=sys.stderr)
        return EXIT_USAGE


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="prunecast", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the API (and, without REDIS_URL, the worker too)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.set_defaults(run=_serve)

    worker = commands.add_parser("worker", help="run an RQ worker (needs REDIS_URL)")
    worker.add_argument("--burst", action="store_true", help="exit when the queue is empty")
    worker.add_argument("--name", default=None, help="worker name (default: RQ's)")
    worker.add_argument(
        "--no-preload",
        dest="preload",
        action="store_false",
        help="do not import the engine before forking (each job then imports torch itself)",
    )
    worker.set_defaults(run=_worker)

    migrate = commands.add_parser("migrate", help="bring the store's schema up to date")
    migrate.set_defaults(run=_migrate)

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
        else:
            client.add_argument("job_id")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
