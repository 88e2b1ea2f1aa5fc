"""The reconciler: no job is ever stuck or silently lost.

Two repairs, each a guarded UPDATE so that several API processes may reconcile at once:
- a `queued` job the transport no longer holds (Redis restarted, embedded process restarted)
  is enqueued again;
- a `running` job whose heartbeat stopped (worker killed, host lost) is re-queued while it has
  attempts left, else failed, and the reason is written on the job.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import timedelta

import structlog
from sqlalchemy import func, select, update

from app.config import Settings
from app.db import Store
from app.queueing import JobQueue, QueueUnavailable
from app.tables import Job, JobStatus, utcnow

log = structlog.get_logger(__name__)


@dataclass
class ReconcileReport:
    requeued: int = 0  # queued jobs the transport had lost
    retried: int = 0  # running jobs with a dead worker, given another attempt
    failed: int = 0  # running jobs with a dead worker and no attempts left
    canceled: int = 0  # dead jobs that had been asked to cancel


def reconcile_once(store: Store, queue: JobQueue, settings: Settings) -> ReconcileReport:
    report = ReconcileReport()
    now = utcnow()
    grace = now - timedelta(seconds=settings.requeue_grace_s)
    with store.session() as session:
        queued_ids = session.scalars(
            select(Job.id).where(
                Job.status == JobStatus.queued.value,
                (Job.enqueued_at.is_(None)) | (Job.enqueued_at < grace),
            )
        ).all()
    for job_id in queued_ids:
        if queue.holds(job_id):
            continue
        try:
            queue.enqueue(job_id)
        except QueueUnavailable as error:
            log.warning("reconciler: queue unavailable, will retry", error=str(error))
            break
        with store.session() as session:
            session.execute(update(Job).where(Job.id == job_id).values(enqueued_at=utcnow()))
        report.requeued += 1
        log.info("reconciler: re-enqueued job missing from the queue", job_id=job_id)

    stale_before = now - timedelta(seconds=settings.heartbeat_timeout_s)
    with store.session() as session:
        stale = session.execute(
            select(Job.id, Job.attempts, Job.cancel_requested, Job.heartbeat_at).where(
                Job.status == JobStatus.running.value,
                func.coalesce(Job.heartbeat_at, Job.started_at, Job.created_at) < stale_before,
            )
        ).all()
    for job_id, attempts, cancel_requested, heartbeat_at in stale:
        _recover_dead_job(store, queue, settings, job_id, attempts, cancel_requested, heartbeat_at, report)
    return report


def _recover_dead_job(
    store: Store,
    queue: JobQueue,
    settings: Settings,
    job_id: str,
    attempts: int,
    cancel_requested: bool,
    heartbeat_at: object,
    report: ReconcileReport,
) -> None:
    silence = f"no heartbeat for over {settings.heartbeat_timeout_s:g}s (last {heartbeat_at})"
    guard = (Job.id == job_id) & (Job.status == JobStatus.running.value) & (Job.attempts == attempts)
    now = utcnow()
    if cancel_requested:
        values = {
            "status": JobStatus.canceled.value,
            "stage": "canceled",
            "finished_at": now,
            "error": f"canceled; its worker had also stopped responding ({silence})",
        }
        outcome = "canceled"
    elif attempts < settings.max_attempts:
        values = {
            "status": JobStatus.queued.value,
            "stage": "queued",
            "progress": 0.0,
            "detail": None,
            "worker": None,
            "enqueued_at": now,
            "error": f"attempt {attempts} lost its worker ({silence}); retrying",
        }
        outcome = "retried"
    else:
        values = {
            "status": JobStatus.failed.value,
            "stage": "failed",
            "finished_at": now,
            "error": f"worker stopped responding on attempt {attempts} of {settings.max_attempts} "
            f"({silence}); giving up",
        }
        outcome = "failed"
    with store.session() as session:
        changed = session.execute(update(Job).where(guard).values(**values)).rowcount  # type: ignore[attr-defined]
    if not changed:
        return  # another reconciler, or the worker itself, got there first
    setattr(report, outcome, getattr(report, outcome) + 1)
    log.warning("reconciler: recovered a job whose worker died", job_id=job_id, outcome=outcome)
    if outcome == "retried":
        try:
            queue.enqueue(job_id)
        except QueueUnavailable as error:
            log.warning("reconciler: queue unavailable; job stays queued", job_id=job_id, error=str(error))


class Reconciler:
    """Runs reconcile_once every `reconcile_interval_s` in a daemon thread."""

    def __init__(self, store: Store, queue: JobQueue, settings: Settings) -> None:
        self.store = store
        self.queue = queue
        self.settings = settings
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="prunecast-reconciler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                reconcile_once(self.store, self.queue, self.settings)
            except Exception:
                log.exception("reconciler pass failed; will try again")
            self._stop.wait(self.settings.reconcile_interval_s)
