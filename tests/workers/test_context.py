"""A running job's handle on the store: best effort where it can be, patient where it must be, and
quick to notice that another attempt took its job over."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import update

from core import lifecycle
from core.settings import Settings
from core.store import Store, StoreUnavailable
from core.tables import Base, Job, JobStatus, Result
from workers import tasks
from workers.context import JobContext, JobStopped
from workers.kinds.dense_windows import store_dense_windows, stored_dense_windows

UNREACHABLE = "postgresql+psycopg://postgres@127.0.0.1:1/nothing"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store(f"sqlite:///{tmp_path / 'store.db'}")
    Base.metadata.create_all(store.engine)
    yield store
    store.dispose()


def queued(store: Store, kind: str = "evaluate") -> str:
    with store.session() as session:
        return lifecycle.submit(session, kind=kind, request={}, model_id="m", request_hash="h").id


def test_progress_and_heartbeats_carry_on_through_an_outage_but_needed_writes_give_up_in_time(
    store: Store, worker_settings: Callable[..., Settings]
) -> None:
    settings = worker_settings(store_retry_s=0.5)
    context = JobContext.claim(store, settings, queued(store))
    assert context is not None
    context.store = Store(UNREACHABLE)  # the store goes away
    try:
        context.report("perplexity", 0.5, "window 1/2")  # logged, not raised
        context._beat_once()
        assert not context.should_stop()
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match=r"unreachable for 0.5s .* while storing results"):
            context.add_results([Result(model_id="m", method="dense", metric="ppl", dataset="d", value=2.0)])
        assert time.monotonic() - started < 5
    finally:
        context.store.dispose()


def test_a_superseded_attempt_learns_it_from_its_heartbeat_while_its_main_thread_hangs(
    store: Store, worker_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = worker_settings()
    job_id = queued(store)
    release = threading.Event()
    noticed = threading.Event()

    def hanging_handler(context: JobContext) -> None:
        release.wait(30)  # a main thread stuck in a call, reporting nothing
        context.check_stop()

    monkeypatch.setattr(tasks, "handler_for", lambda kind: hanging_handler)
    worker = threading.Thread(target=tasks.execute_job, args=(store, settings, job_id, noticed.set))
    worker.start()
    try:
        _wait(lambda: _status(store, job_id) is JobStatus.running)
        with store.session() as session:  # the reconciler gave the job another attempt
            session.execute(update(Job).where(Job.id == job_id).values(status=JobStatus.queued))
        assert noticed.wait(10 * settings.heartbeat_interval_s), "the heartbeat never saw it"
    finally:
        release.set()
        worker.join(30)
    assert _status(store, job_id) is JobStatus.queued  # the stale attempt recorded no outcome


def test_a_cancel_that_arrives_after_the_last_safe_point_still_cancels(
    store: Store, worker_settings: Callable[..., Settings]
) -> None:
    context = JobContext.claim(store, worker_settings(), queued(store))
    assert context is not None
    context.add_results([Result(model_id="m", method="dense", metric="ppl", dataset="d", value=2.0)])
    with store.session() as session:
        lifecycle.request_cancel(session, context.job_id)
    with pytest.raises(JobStopped, match="canceled"):
        context.add_results([Result(model_id="m", method="dense", metric="acc", dataset="d", value=0.5)])
    context.succeed()  # the handler had finished: success is refused, the cancel wins
    assert _status(store, context.job_id) is JobStatus.canceled
    with store.session() as session:
        assert session.query(Result).count() == 0


def _status(store: Store, job_id: str) -> JobStatus:
    with store.session() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job.status


def _wait(predicate: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_an_output_write_whose_commit_landed_unconfirmed_is_not_stored_twice(
    store: Store, worker_settings: Callable[..., Settings]
) -> None:
    context = JobContext.claim(store, worker_settings(), queued(store))
    assert context is not None
    row = Result(model_id="m", method="dense", metric="ppl", dataset="d", value=2.0)
    context.add_results([row])
    context.add_results([row])  # the retry of a write whose commit landed: a no-op, not a crash
    with store.session() as session:
        assert session.query(Result).count() == 1


def test_the_embedded_worker_hands_the_queue_to_a_fresh_thread_when_its_job_hangs(
    store: Store, worker_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.queueing import ThreadQueue

    settings = worker_settings()
    release = threading.Event()
    hung, other = queued(store), queued(store)

    def handler(context: JobContext) -> None:
        if context.job_id == hung and context.attempt == 1:
            release.wait(60)  # attempt 1 hangs; its retry runs normally

    monkeypatch.setattr(tasks, "handler_for", lambda kind: handler)
    queue = ThreadQueue(store, settings)
    try:
        queue.enqueue(hung)
        queue.enqueue(other)
        _wait(lambda: _status(store, hung) is JobStatus.running)
        with store.session() as session:  # the reconciler retried the hung job
            session.execute(update(Job).where(Job.id == hung).values(status=JobStatus.queued))
        queue.enqueue(hung)
        _wait(lambda: _status(store, hung) is JobStatus.succeeded, timeout=10 * settings.heartbeat_interval_s)
        _wait(lambda: _status(store, other) is JobStatus.succeeded)  # the queue behind it moved on too
    finally:
        release.set()
        queue.close()


def test_a_cache_write_the_store_refuses_is_dropped_but_other_errors_still_surface(
    store: Store, worker_settings: Callable[..., Settings]
) -> None:
    context = JobContext.claim(store, worker_settings(), queued(store))
    assert context is not None
    with store.session() as session:
        kept = Result(model_id="m", method="dense", metric="ppl", dataset="d", value=2.0)
        session.add(kept)
        session.flush()
        kept_id = kept.id
    key = "bfloat16 on cpu (test)"
    # the baseline the windows hang on is gone (deleted while the job ran): the foreign key refuses
    context.write_cache(lambda s: store_dense_windows(s, kept_id + 1, key, {0: 1.5}), "keeping windows")
    context.write_cache(lambda s: store_dense_windows(s, kept_id, key, {0: 1.5}), "keeping windows")
    with store.session() as session:
        assert stored_dense_windows(session, kept_id, key) == {0: 1.5}
        assert stored_dense_windows(session, kept_id + 1, key) == {}

    def broken(session: object) -> None:
        raise ValueError("a bug, not the store")

    with pytest.raises(ValueError, match="a bug"):
        context.write_cache(broken, "keeping windows")
