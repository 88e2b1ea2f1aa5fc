"""The job function every worker runs: claim, dispatch by kind, record the outcome.

RQ workers call `run_job(job_id)`; the embedded worker thread calls `execute_job` with the
process's own store. Torch is imported only by the kind handlers, inside the job.
"""

from __future__ import annotations

import structlog

from app.config import Settings, get_settings
from app.db import Store
from app.logs import configure_logging
from workers.context import JobContext, JobFailure, JobStopped
from workers.kinds import RESUMING_KINDS, handler_for

log = structlog.get_logger(__name__)


def run_job(job_id: str) -> None:
    """RQ entry point (runs in the forked work horse: no store or CUDA state is inherited)."""
    settings = get_settings()
    configure_logging(settings)
    store = Store(settings.store_url)
    try:
        execute_job(store, settings, job_id)
    finally:
        store.dispose()


def execute_job(store: Store, settings: Settings, job_id: str) -> None:
    context = JobContext.claim(store, settings, job_id)
    if context is None:
        log.info("job not claimable (already taken, finished or canceled); skipping", job_id=job_id)
        return
    with structlog.contextvars.bound_contextvars(job_id=job_id), context.heartbeat():
        context.log.info("job started")
        try:
            if context.attempt > 1 and context.kind not in RESUMING_KINDS:
                context.discard_earlier_attempts()
            handler_for(context.kind)(context)
            context.check_stop()
        except JobStopped as stop:
            if context.cancel_seen and not context.superseded:
                context.cancel()
            else:
                context.log.warning("job stopped", reason=str(stop))
        except JobFailure as failure:
            context.fail(str(failure))
        except Exception as error:
            context.log.exception("job crashed")
            context.fail(f"internal error ({type(error).__name__}): {error}")
        else:
            context.succeed()
