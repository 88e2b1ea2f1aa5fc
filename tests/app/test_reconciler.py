"""The reconciler recovers dead jobs, and only dead ones: silence counts only while the store is
reachable, a job whose progress stopped is hung even when its heartbeat goes on, and a job
submitted a moment ago is not queued twice."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import update

from app.reconciler import Reconciler, reconcile_once
from core import lifecycle
from core.settings import Settings
from core.store import Store
from core.tables import Job, JobStatus, utcnow


class RecordingQueue:
    def __init__(self) -> None:
        self.enqueued: list[str] = []

    def enqueue(self, job_id: str) -> None:
        self.enqueued.append(job_id)

    def holds(self, job_id: str) -> bool:
        return job_id in self.enqueued

    def remove(self, job_id: str) -> None: ...

    def depth(self) -> int:
        return len(self.enqueued)

    def ping(self) -> None: ...

    def close(self) -> None: ...


def running_job(store: Store, **values: object) -> str:
    with store.session() as session:
        job_id = lifecycle.submit(session, kind="evaluate", request={}, model_id="m", request_hash="h").id
        lifecycle.claim(session, job_id, "w:1")
        session.execute(update(Job).where(Job.id == job_id).values(**values))
    return job_id


def status_of(store: Store, job_id: str) -> Job:
    with store.session() as session:
        row = session.get(Job, job_id)
        assert row is not None
        return row


def test_after_an_outage_silent_jobs_get_a_whole_heartbeat_timeout_first(
    clean_store: Store, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(heartbeat_timeout_s=60.0)
    job_id = running_job(clean_store, heartbeat_at=utcnow() - timedelta(seconds=300))
    queue = RecordingQueue()
    back = utcnow() - timedelta(seconds=10)  # the store came back 10 s ago: workers had no chance
    assert reconcile_once(clean_store, queue, settings, store_up_since=back).retried == 0
    assert status_of(clean_store, job_id).status is JobStatus.running
    long_back = utcnow() - timedelta(seconds=61)
    assert reconcile_once(clean_store, queue, settings, store_up_since=long_back).retried == 1
    row = status_of(clean_store, job_id)
    assert row.status is JobStatus.queued and queue.enqueued == [job_id]
    assert "no heartbeat for over 60s" in (row.error or "")


def test_a_job_that_beats_without_progress_is_retried_as_hung(
    clean_store: Store, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(heartbeat_timeout_s=60.0, progress_timeout_s=120.0)
    job_id = running_job(
        clean_store,
        heartbeat_at=utcnow(),
        progress_at=utcnow() - timedelta(seconds=500),
        stage="perplexity",
        detail="window 7/20",
    )
    report = reconcile_once(clean_store, RecordingQueue(), settings)
    assert report.retried == 1
    error = status_of(clean_store, job_id).error or ""
    assert "no progress for over 120s" in error and "stage 'perplexity', window 7/20" in error


def test_a_hung_job_on_its_last_attempt_fails_with_the_reason(
    clean_store: Store, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(heartbeat_timeout_s=60.0, progress_timeout_s=120.0, max_attempts=1)
    job_id = running_job(clean_store, heartbeat_at=utcnow(), progress_at=utcnow() - timedelta(seconds=500))
    assert reconcile_once(clean_store, RecordingQueue(), settings).failed == 1
    row = status_of(clean_store, job_id)
    assert row.status is JobStatus.failed and "giving up" in (row.error or "")


def test_a_job_submitted_a_moment_ago_is_not_enqueued_again(
    clean_store: Store, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(requeue_grace_s=30.0)
    with clean_store.session() as session:  # stored; its enqueue (not yet recorded) is in flight
        job_id = lifecycle.submit(session, kind="evaluate", request={}, model_id="m", request_hash="h").id
    queue = RecordingQueue()
    assert reconcile_once(clean_store, queue, settings).requeued == 0
    with clean_store.session() as session:
        old = utcnow() - timedelta(seconds=31)
        session.execute(update(Job).where(Job.id == job_id).values(created_at=old))
    assert reconcile_once(clean_store, queue, settings).requeued == 1 and queue.enqueued == [job_id]


def test_the_reconciler_notices_an_outage_and_restarts_its_clock_when_the_store_returns(
    clean_store: Store, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings()
    unreachable = Store("postgresql+psycopg://postgres@127.0.0.1:1/none")
    reconciler = Reconciler(unreachable, RecordingQueue(), settings)
    assert reconciler.pass_once() is None and reconciler.store_up_since is None
    unreachable.dispose()
    reconciler.store = clean_store
    before = utcnow()
    assert reconciler.pass_once() is not None
    assert reconciler.store_up_since is not None and reconciler.store_up_since >= before
