"""The job function every worker runs: claim, dispatch by kind, record the outcome.

RQ workers call `run_job(job_id)`; the embedded worker thread calls `execute_job` with the
process's own store (both by name: `core.entrypoints`). Torch is imported only by the kind
handlers, inside the job. The outcome is one transition of `core.lifecycle`; when the store stays
unreachable past `store_retry_s`, the attempt ends without one and the reconciler retries the job
once the store is back.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import structlog

from core.logs import configure_logging
from core.settings import Settings, get_settings
from core.store import Store, StoreUnavailable, is_outage
from workers.context import JobContext, JobFailure, JobStopped
from workers.kinds import RESUMING_KINDS, handler_for

log = structlog.get_logger(__name__)

SUPERSEDED_EXIT_CODE = 70
"""Exit status of a work horse that ended itself because its superseded job would not stop."""


def run_job(job_id: str) -> None:
    """RQ entry point (runs in the forked work horse: no store or CUDA state is inherited). A job
    whose attempt was superseded (hung, then retried elsewhere) and does not reach a safe point within
    a heartbeat timeout ends the horse, so the worker is free for other jobs."""
    settings = get_settings()
    configure_logging(settings)
    store = Store(settings.store_url)
    finished = threading.Event()

    def end_horse_if_stuck() -> None:
        if not finished.wait(settings.heartbeat_timeout_s):
            log.error("superseded job did not stop; ending the work horse", job_id=job_id)
            os._exit(SUPERSEDED_EXIT_CODE)

    def watch() -> None:  # in a thread of its own: the heartbeat thread must end with the job
        threading.Thread(target=end_horse_if_stuck, name=f"watchdog-{job_id}", daemon=True).start()

    try:
        execute_job(store, settings, job_id, on_superseded=watch)
    finally:
        finished.set()
        store.dispose()


def execute_job(
    store: Store, settings: Settings, job_id: str, on_superseded: Callable[[], None] | None = None
) -> None:
    """Claim and run one job; `on_superseded` runs (in the heartbeat thread) if another attempt
    takes the job over while this one runs."""
    context = JobContext.claim(store, settings, job_id)
    if context is None:
        log.info("job not claimable (already taken, finished or canceled); skipping", job_id=job_id)
        return
    with structlog.contextvars.bound_contextvars(job_id=job_id), context.heartbeat(on_superseded):
        context.log.info("job started")
        try:
            run_attempt(context)
        except StoreUnavailable as outage:
            context.log.error(
                "store unreachable; leaving the job to the reconciler's retry", error=str(outage)
            )


def run_attempt(context: JobContext) -> None:
    """Run the claimed attempt to its outcome: succeeded, failed (with a readable reason) or canceled;
    a superseded attempt records nothing."""
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
    except StoreUnavailable:
        raise
    except Exception as error:
        if is_outage(error):  # a store read of the engine's own, not retried: the job is not at fault
            raise StoreUnavailable(f"the store went away during the job: {type(error).__name__}") from error
        context.log.exception("job crashed")
        context.fail(f"internal error ({type(error).__name__}): {error}")
    else:
        context.succeed()
