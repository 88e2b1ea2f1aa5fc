"""The reconciler: no job is ever stuck or silently lost.

Two repairs, each through a guarded transition of `core.lifecycle`, so several API processes may
reconcile at once:
- a `queued` job the transport no longer holds (Redis restarted, embedded process restarted) is
  enqueued again, once it is older than the enqueue grace (`requeue_grace_s`);
- a `running` job whose worker went silent (no heartbeat for `heartbeat_timeout_s`) or hung (no
  new progress for `progress_timeout_s`) is queued again while it has attempts left, else failed,
  and the reason is written on the job.

A worker cannot beat while the store is down, so silence counts only while the store has been
reachable: after an outage (or this process's start) the reconciler waits a whole timeout before it
presumes a silent or hung job dead, and the retry re-checks the silence in its own UPDATE.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime, timedelta

import structlog
from sqlalchemy import func, select

from app.queueing import JobQueue, QueueUnavailable
from core import lifecycle
from core.artifacts import remove_job_files
from core.settings import Settings
from core.store import Store, is_outage
from core.tables import Job, JobStatus, utcnow

log = structlog.get_logger(__name__)


@dataclass
class ReconcileReport:
    requeued: int = 0  # queued jobs the transport had lost
    retried: int = 0  # running jobs with a dead worker, given another attempt
    failed: int = 0  # running jobs with a dead worker and no attempts left
    canceled: int = 0  # dead jobs that had been asked to cancel


def liveness(settings: Settings, now: datetime, store_up_since: datetime | None) -> lifecycle.Liveness:
    """Which running jobs count as dead now: silence and hangs count only from the moment the store
    was last seen coming back (None: it has always been up)."""
    up_since = store_up_since or datetime.min.replace(tzinfo=now.tzinfo)
    silent_after = timedelta(seconds=settings.heartbeat_timeout_s)
    hung_after = timedelta(seconds=settings.progress_timeout_s)
    return lifecycle.Liveness(
        silent_before=now - silent_after if now - up_since >= silent_after else None,
        hung_before=now - hung_after if now - up_since >= hung_after else None,
    )


def reconcile_once(
    store: Store, queue: JobQueue, settings: Settings, *, store_up_since: datetime | None = None
) -> ReconcileReport:
    report = ReconcileReport()
    _requeue_lost(store, queue, settings, report)
    now = utcnow()
    alive = liveness(settings, now, store_up_since)
    with store.session() as session:
        dead = lifecycle.dead_jobs(session, alive)
    for job in dead:
        _recover(store, queue, settings, job, alive, report)
    return report


def _requeue_lost(store: Store, queue: JobQueue, settings: Settings, report: ReconcileReport) -> None:
    grace = utcnow() - timedelta(seconds=settings.requeue_grace_s)
    with store.session() as session:
        queued_ids = session.scalars(
            select(Job.id).where(
                Job.status == JobStatus.queued, func.coalesce(Job.enqueued_at, Job.created_at) < grace
            )
        ).all()
    for job_id in queued_ids:
        try:
            if queue.holds(job_id):
                continue
            queue.enqueue(job_id)
        except QueueUnavailable as error:
            log.warning("reconciler: queue unavailable, will retry", error=str(error))
            return  # dead-job recovery below still runs: it needs the store, not the queue
        with store.session() as session:
            lifecycle.mark_enqueued(session, job_id)
        report.requeued += 1
        log.info("reconciler: re-enqueued job missing from the queue", job_id=job_id)


def _why_dead(job: lifecycle.DeadJob, alive: lifecycle.Liveness, settings: Settings) -> str:
    if alive.silent_before is not None and (
        job.heartbeat_at is None or job.heartbeat_at < alive.silent_before
    ):
        return f"no heartbeat for over {settings.heartbeat_timeout_s:g}s (last {job.heartbeat_at})"
    where = f"stage {job.stage!r}" + (f", {job.detail}" if job.detail else "")
    return f"no progress for over {settings.progress_timeout_s:g}s ({where}; last {job.progress_at})"


def _recover(
    store: Store,
    queue: JobQueue,
    settings: Settings,
    job: lifecycle.DeadJob,
    alive: lifecycle.Liveness,
    report: ReconcileReport,
) -> None:
    why = _why_dead(job, alive, settings)
    removed: list[str] | None = None
    with store.session() as session:
        if job.cancel_requested:
            removed = lifecycle.cancel_dead(
                session, job, alive, f"canceled; its worker had also stopped ({why})"
            )
            outcome, changed = "canceled", removed is not None
        elif job.attempts < settings.max_attempts:
            reason = f"attempt {job.attempts} lost its worker ({why}); retrying"
            outcome, changed = "retried", lifecycle.retry(session, job, alive, reason)
        else:
            reason = (
                f"worker stopped responding on attempt {job.attempts} of {settings.max_attempts} ({why}); "
                "giving up"
            )
            outcome, changed = "failed", lifecycle.give_up(session, job, alive, reason)
    if not changed:
        return  # it beat meanwhile, or another reconciler or the worker itself got there first
    if removed is not None:
        remove_job_files(settings, job.job_id, removed)  # the canceled job keeps nothing
    setattr(report, outcome, getattr(report, outcome) + 1)
    log.warning("reconciler: recovered a job whose worker died", job_id=job.job_id, outcome=outcome, why=why)
    if outcome == "retried":
        try:
            queue.enqueue(job.job_id)
        except QueueUnavailable as error:
            log.warning(
                "reconciler: queue unavailable; job stays queued", job_id=job.job_id, error=str(error)
            )


class Reconciler:
    """Runs reconcile_once every `reconcile_interval_s` in a daemon thread, tracking since when the
    store has been reachable (its start counts as a return)."""

    def __init__(self, store: Store, queue: JobQueue, settings: Settings) -> None:
        self.store = store
        self.queue = queue
        self.settings = settings
        self.store_up_since: datetime | None = utcnow()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="prunecast-reconciler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def pass_once(self) -> ReconcileReport | None:
        """One pass; None when the store was unreachable (the next reachable pass restarts the clock)."""
        up_since = self.store_up_since or utcnow()  # back as of this pass, if it gets through
        try:
            report = reconcile_once(self.store, self.queue, self.settings, store_up_since=up_since)
        except Exception as error:
            if not is_outage(error):
                log.exception("reconciler pass failed; will try again")
            elif self.store_up_since is not None:
                log.warning("reconciler: the store is unreachable", error=type(error).__name__)
                self.store_up_since = None
            return None
        if self.store_up_since is None:
            log.info("reconciler: the store is back; silent jobs get a full timeout first")
            self.store_up_since = up_since
        return report

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.pass_once()
            self._stop.wait(self.settings.reconcile_interval_s)
