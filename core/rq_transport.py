"""How a job id goes onto RQ: one definition for the API (`app.queueing`) and for workers that
create jobs themselves (a fanned-out sweep's children), so both enqueue alike; and how many
workers listen on a queue (whether a sweep fans out).

The queue only carries the id; the store row, committed first, is the truth (`core.lifecycle`).
"""

from __future__ import annotations

from typing import Any

from core.entrypoints import JOB_FUNCTION

RQ_RESULT_TTL_S = 3600
"""RQ keeps its own record of a finished job only briefly: the store has the real one."""


def enqueue_on(queue: Any, job_id: str) -> None:
    """Put `job_id` on an `rq.Queue` for a worker's `JOB_FUNCTION` (raises redis errors as they are)."""
    queue.enqueue(
        JOB_FUNCTION,
        job_id,
        job_id=job_id,
        job_timeout=-1,  # jobs may run for hours; liveness is our heartbeat's business
        result_ttl=RQ_RESULT_TTL_S,
        failure_ttl=RQ_RESULT_TTL_S,
        description=f"prunecast job {job_id}",
    )


def listening_workers(queue: Any) -> int:
    """How many RQ workers are registered on an `rq.Queue` (one that died stays counted until its
    registration expires, a few minutes; raises redis errors as they are)."""
    from rq import Worker

    return int(Worker.count(queue=queue))
