"""A sweep fanned out across workers: one child `prune` job per sparsity (`fan_out: true`, or
null with more than one worker on the queue: `fans_out`).

The sweep measures (or reuses) the dense baseline and dense accuracy itself, as an ordinary sweep
does. Then it creates one `prune` job per sparsity it has no live or finished child for (children
of the sweep: `jobs.parent_id`), puts them on the queue, and works through them as well: whenever
no child of its own is running and one is still queued, it claims the last queued one (the queue
hands out the first ones, so the two rarely race for a child) and runs it in a thread, exactly as
a worker would (`workers.tasks.execute_job`). Other workers take the rest from the queue. The
store coordinates everything:

- a child reuses the sweep's dense baseline (`find_dense_baseline`'s `parent_job_id`), draws the same
  calibration windows (same corpus, seed, count and length) and tags its results `sweep_job_id`;
- the sweep's progress is its children's, averaged ("2/4 measured; s=0.3: pruning block 7/30");
- canceling the sweep cancels its children (`core.lifecycle.request_cancel`), and a sweep that
  stops cancels the children it leaves;
- a failed child fails the sweep with the child's reason, and the other children are canceled;
- a retried sweep keeps its children: finished ones are not redone and running ones go on; a child
  that died is retried by the reconciler like any job;
- once every child succeeded, the sweep fits its laws on their results.

Without a queue transport (the embedded deployment) nothing is enqueued and the sweep runs every
child itself, one after another, in its own process.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import select

from core import lifecycle
from core.rq_transport import enqueue_on, listening_workers
from core.settings import Settings
from core.specs.jobs import PruneJobCreate, SweepJobCreate
from core.store import StoreUnavailable
from core.tables import Job, JobStatus, Result
from workers.context import JobContext, JobFailure
from workers.kinds.job_data import Prepared

POLL_S = 0.5  # how often the sweep reads its children's rows
LIVE = (JobStatus.queued, JobStatus.running, JobStatus.succeeded)
DETAIL_LIMIT = 256  # jobs.detail's width

RowKey = tuple[str, str]  # (metric, dataset) of one result row of a sparsity


def child_request(spec: SweepJobCreate, sparsity: float) -> dict[str, Any]:
    """The `prune` request that measures one sparsity of the sweep exactly as the sweep would."""
    shared = spec.model_dump(mode="json", exclude={"kind", "sparsities", "save_artifacts", "fan_out"})
    request = {**shared, "kind": "prune", "sparsity": sparsity, "save_artifact": spec.save_artifacts}
    return PruneJobCreate.model_validate(request).model_dump(mode="json")


def measure_through_children(
    context: JobContext, spec: SweepJobCreate, prepared: Prepared, *, start: float, end: float
) -> dict[float, dict[RowKey, Result]]:
    """Every pruned sparsity measured by a child job; their result rows per sparsity, once all
    succeeded. Reports progress within [start, end]; raises JobFailure if a child failed or was
    canceled on its own, JobStopped if the sweep must stop (either way after canceling the
    children, unless a newer attempt of the sweep owns them)."""
    prepared.loaded.model = None  # type: ignore[assignment]  # the children load their own copies
    gc.collect()
    children = _live_children(context)
    missing = [s for s in spec.pruned_sparsities if s not in children]
    if missing:
        ids = context.add_children(
            "prune", [child_request(spec, s) for s in missing], prepared.source.model_id
        )
        children.update(zip(missing, ids, strict=True))
        _enqueue(context, ids)
        context.log.info(
            "sweep fanned out", children={f"{s:g}": i for s, i in zip(missing, ids, strict=True)}
        )
    runner = _InlineRunner(context)
    try:
        while not _all_succeeded(context, children, runner, start=start, end=end):
            time.sleep(POLL_S)
    except StoreUnavailable:
        raise  # the sweep is retried once the store is back, and keeps its children
    except Exception:  # stopped, failed or crashed: the children it leaves are canceled ...
        if not context.superseded:  # ... unless a newer attempt of the sweep owns them now
            _cancel_children(context, children.values())
        runner.join()
        raise
    runner.join()
    return _children_rows(context, children, spec)


def _live_children(context: JobContext) -> dict[float, str]:
    """Sparsity -> id of this sweep's children that are queued, running or succeeded (a retried sweep
    keeps them); children that failed or were canceled are left for new ones."""
    rows = context.read(lambda session: lifecycle.children_of(session, context.job_id), "reading child jobs")
    return {float(job.request["sparsity"]): job.id for job in rows if job.status in LIVE}


def fans_out(context: JobContext, spec: SweepJobCreate) -> tuple[bool, str]:
    """Whether this sweep measures through children, and why. `fan_out` null decides here, when
    the sweep starts measuring: a sweep that already has children (a retried one) stays fanned out;
    otherwise it fans out when it has more than one sparsity to prune and more than one worker
    listens on its queue. The embedded deployment, and a queue that does not answer, measure in
    turn."""
    if spec.fan_out is not None:
        return spec.fan_out, "asked for" if spec.fan_out else "asked not to"
    if _live_children(context):
        return True, "an earlier attempt of this sweep fanned out"
    if len(spec.pruned_sparsities) < 2:
        return False, "one sparsity to prune"
    from redis.exceptions import RedisError

    try:
        with _queue(context.settings) as queue:
            if queue is None:
                return False, "the embedded deployment has no queue"
            workers = listening_workers(queue)
    except (RedisError, OSError) as error:
        return False, f"the queue did not answer ({error})"
    return workers > 1, f"{workers} worker(s) listen on queue {context.settings.queue_name}"


@contextmanager
def _queue(settings: Settings) -> Iterator[Any]:
    """The sweep's `rq.Queue` on a connection closed afterwards; None in the embedded deployment."""
    if settings.redis_url is None:
        yield None
        return
    from redis import Redis
    from rq import Queue

    redis = Redis.from_url(settings.redis_url, socket_connect_timeout=2, socket_timeout=5)
    try:
        yield Queue(settings.queue_name, connection=redis)
    finally:
        redis.close()


def _enqueue(context: JobContext, ids: Sequence[str]) -> None:
    """Put the children on the RQ queue (best effort: the reconciler enqueues any queued job the
    queue lacks); nothing to do in the embedded deployment, where this sweep runs them."""
    from redis.exceptions import RedisError

    try:
        with _queue(context.settings) as queue:
            if queue is None:
                return
            for job_id in ids:
                enqueue_on(queue, job_id)
                with context.store.session() as session:
                    lifecycle.mark_enqueued(session, job_id)
    except (RedisError, OSError) as error:
        context.log.warning("could not enqueue child jobs; the reconciler will", error=str(error))


class _InlineRunner:
    """Runs at most one child at a time in a thread of this process, as a worker would."""

    def __init__(self, context: JobContext) -> None:
        self.context = context
        self.thread: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def start(self, job_id: str) -> None:
        from workers.tasks import execute_job  # the job function itself (imported late: it imports kinds)

        context = self.context
        self.thread = threading.Thread(
            target=execute_job,
            args=(context.store, context.settings, job_id),
            name=f"child-{job_id}",
            daemon=True,
        )
        self.thread.start()

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join(timeout=self.context.settings.heartbeat_timeout_s)


def _all_succeeded(
    context: JobContext, children: dict[float, str], runner: _InlineRunner, *, start: float, end: float
) -> bool:
    """One look at the children: fail on a failed one, start a queued one here if idle, report
    the sweep's progress (a safe point: raises JobStopped when the sweep must stop)."""
    context.check_in()  # a cancel of the sweep, which cancels the children, wins over their state
    ids = list(children.values())
    rows = context.read(
        lambda session: {job.id: job for job in session.scalars(select(Job).where(Job.id.in_(ids))).all()},
        "reading child jobs",
    )
    by_sparsity = {s: rows[job_id] for s, job_id in sorted(children.items())}
    for sparsity, job in by_sparsity.items():
        if job.status in (JobStatus.failed, JobStatus.canceled):
            raise JobFailure(f"s={sparsity:g} (child job {job.id}) {job.status.value}: {job.error}")
    done = [s for s, job in by_sparsity.items() if job.status is JobStatus.succeeded]
    if len(done) == len(by_sparsity):
        return True
    if not runner.busy:  # from the back of the list: the queue's workers take from the front
        queued = [job.id for job in by_sparsity.values() if job.status is JobStatus.queued]
        if queued:
            runner.start(queued[-1])
    shares = [
        1.0 if job.status is JobStatus.succeeded else float(job.progress) for job in by_sparsity.values()
    ]
    running = [
        f"s={s:g}: {job.stage}{f' {job.detail}' if job.detail else ''}"
        for s, job in by_sparsity.items()
        if job.status is JobStatus.running
    ]
    detail = "; ".join([f"{len(done)}/{len(by_sparsity)} measured", *running])[:DETAIL_LIMIT]
    context.report("sparsities", start + (end - start) * sum(shares) / len(shares), detail)
    return False


def _cancel_children(context: JobContext, ids: Sequence[str] | Any) -> None:
    """Cancel the children that are not final (the sweep stops or failed)."""
    ids = list(ids)

    def cancel(session: Any) -> None:
        for job_id in ids:
            lifecycle.request_cancel(session, job_id)

    try:
        context.read(cancel, "canceling child jobs")
    except Exception:  # the reconciler still sees a parent that is final
        context.log.warning("could not cancel child jobs", exc_info=True)


def _children_rows(
    context: JobContext, children: dict[float, str], spec: SweepJobCreate
) -> dict[float, dict[RowKey, Result]]:
    """The pruned result rows of every child, per sparsity."""
    ids = list(children.values())
    query = select(Result).where(Result.job_id.in_(ids), Result.sparsity > 0.0)
    found: dict[float, dict[RowKey, Result]] = {}
    for row in context.read(lambda session: session.scalars(query).all(), "reading the children's points"):
        found.setdefault(row.sparsity, {})[(row.metric, row.dataset)] = row
    missing = [s for s in spec.pruned_sparsities if s not in found]
    if missing:
        raise JobFailure(f"children succeeded but stored no points for sparsities {missing}")
    return found
