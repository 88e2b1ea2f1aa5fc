"""`prunecast worker`: an RQ worker process that runs jobs (the engine side's entry point).

The forking Worker runs each job in a fresh child (the "work horse"). This parent imports the
engine before forking (so a job starts in milliseconds, not seconds) but never initialises CUDA,
so CUDA only ever starts in a child that does not fork again.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from core.logs import configure_logging
from core.settings import get_settings

EXIT_OK = 0
EXIT_USAGE = 3


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prunecast worker", description="Run an RQ worker (needs REDIS_URL)."
    )
    parser.add_argument("--burst", action="store_true", help="exit when the queue is empty")
    parser.add_argument("--name", default=None, help="worker name (default: RQ's)")
    parser.add_argument(
        "--no-preload",
        dest="preload",
        action="store_false",
        help="do not import the engine before forking (each job then imports torch itself)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from redis import Redis
    from rq import Queue, Worker

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
        preload_engine()
    worker = Worker([queue], connection=connection, name=args.name)
    worker.work(burst=args.burst, with_scheduler=False, logging_level=settings.log_level.upper())
    return EXIT_OK


def preload_engine() -> None:
    """Import every job kind's handler once in the parent. Importing torch and transformers does not
    initialise CUDA; checked here so that a future import that does would fail loudly instead of
    breaking CUDA in every forked child."""
    import torch

    from workers.kinds import HANDLER_MODULES

    for module in HANDLER_MODULES.values():
        importlib.import_module(module)
    if torch.cuda.is_initialized():
        raise RuntimeError("preloading the engine initialised CUDA; run the worker with --no-preload")


if __name__ == "__main__":
    sys.exit(main())
