"""Every edge of the job lifecycle is one guarded UPDATE: it happens from the state it leaves, for the
actor that owns it, exactly once; outputs follow the job (nothing of a canceled job stays)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select, update

from core import job_outputs, lifecycle
from core.store import Store
from core.tables import Artifact, Job, JobStatus, ProbePoint, Result, utcnow


def submitted(store: Store) -> str:
    with store.session() as session:
        return lifecycle.submit(session, kind="evaluate", request={}, model_id="m", request_hash="h").id


def claimed(store: Store, worker: str = "w:1") -> job_outputs.Attempt:
    job_id = submitted(store)
    with store.session() as session:
        attempt = lifecycle.claim(session, job_id, worker)
    assert attempt is not None
    return attempt


def job(store: Store, job_id: str) -> Job:
    with store.session() as session:
        row = session.get(Job, job_id)
        assert row is not None
        return row


def add_outputs(store: Store, attempt: job_outputs.Attempt) -> None:
    with store.session() as session:
        job_outputs.lock_for_output(session, attempt)
        session.add(
            Result(job_id=attempt.job_id, model_id="m", method="dense", metric="ppl", dataset="d", value=2.0)
        )
        session.add(Artifact(job_id=attempt.job_id, kind="pruned-model", path="/x", bytes=1, sha256="0" * 64))
        session.add(ProbePoint(job_id=attempt.job_id, probe="model", space="probs", metric="kl", value=0.1))


def outputs(store: Store, job_id: str) -> int:
    with store.session() as session:
        return sum(
            len(session.scalars(select(table.id).where(table.job_id == job_id)).all())
            for table in job_outputs.OUTPUT_TABLES
        )


def test_a_queued_job_is_claimed_once_and_the_status_is_the_enum(clean_store: Store) -> None:
    job_id = submitted(clean_store)
    with clean_store.session() as session:
        first = lifecycle.claim(session, job_id, "w:1")
        second = lifecycle.claim(session, job_id, "w:2")
    assert first == job_outputs.Attempt(job_id, 1) and second is None
    row = job(clean_store, job_id)
    assert row.status is JobStatus.running and row.worker == "w:1" and row.progress_at is not None


def test_writes_of_a_superseded_attempt_change_nothing(clean_store: Store) -> None:
    attempt = claimed(clean_store)
    stale = job_outputs.Attempt(attempt.job_id, attempt.number + 1)
    with clean_store.session() as session:
        assert not lifecycle.record_progress(session, stale, stage="x", progress=0.5, detail=None)
        assert lifecycle.beat(session, stale) is None
        assert not lifecycle.succeed(session, stale)
        assert not lifecycle.fail(session, stale, "no")
        assert lifecycle.cancel(session, stale) is None
        with pytest.raises(job_outputs.OutputRefused) as refused:
            job_outputs.lock_for_output(session, stale)
    assert refused.value.superseded
    assert job(clean_store, attempt.job_id).status is JobStatus.running


def test_success_clears_the_error_an_earlier_attempt_left(clean_store: Store) -> None:
    attempt = claimed(clean_store)
    with clean_store.session() as session:
        session.execute(update(Job).where(Job.id == attempt.job_id).values(error="attempt 1 lost its worker"))
        assert lifecycle.succeed(session, attempt)
        assert not lifecycle.fail(session, attempt, "too late: it is final")
    row = job(clean_store, attempt.job_id)
    assert row.status is JobStatus.succeeded and row.error is None and row.progress == 1.0


def test_canceling_a_queued_job_deletes_what_an_earlier_attempt_stored(clean_store: Store) -> None:
    attempt = claimed(clean_store)
    add_outputs(clean_store, attempt)
    with clean_store.session() as session:  # its worker died; the reconciler queued it again
        session.execute(update(Job).where(Job.id == attempt.job_id).values(status=JobStatus.queued))
        canceled = lifecycle.request_cancel(session, attempt.job_id)
        assert canceled == lifecycle.CancelRequest(
            lifecycle.CancelOutcome.CANCELED, ["/x"]
        )  # files to remove
        assert lifecycle.request_cancel(session, attempt.job_id).outcome is lifecycle.CancelOutcome.FINISHED
        assert lifecycle.request_cancel(session, "nope").outcome is lifecycle.CancelOutcome.MISSING
        assert lifecycle.claim(session, attempt.job_id, "w:2") is None  # it never runs
    assert outputs(clean_store, attempt.job_id) == 0


def test_after_a_cancel_request_no_output_is_stored_and_success_is_refused(clean_store: Store) -> None:
    attempt = claimed(clean_store)
    add_outputs(clean_store, attempt)
    with clean_store.session() as session:
        assert lifecycle.request_cancel(session, attempt.job_id).outcome is lifecycle.CancelOutcome.REQUESTED
        assert lifecycle.beat(session, attempt) is True  # the worker learns it at its next heartbeat
        with pytest.raises(job_outputs.OutputRefused) as refused:
            job_outputs.lock_for_output(session, attempt)
        assert not refused.value.superseded
        assert not lifecycle.succeed(session, attempt)
        assert lifecycle.cancel(session, attempt) == ["/x"]
    assert job(clean_store, attempt.job_id).status is JobStatus.canceled
    assert outputs(clean_store, attempt.job_id) == 0


def test_a_retried_attempt_discards_the_dead_ones_outputs_only_while_it_owns_the_job(
    clean_store: Store,
) -> None:
    attempt = claimed(clean_store)
    add_outputs(clean_store, attempt)
    with clean_store.session() as session:
        assert not job_outputs.discard_earlier_attempts(session, job_outputs.Attempt(attempt.job_id, 7))
    assert outputs(clean_store, attempt.job_id) == 3
    with clean_store.session() as session:
        assert job_outputs.discard_earlier_attempts(session, attempt)
    assert outputs(clean_store, attempt.job_id) == 0


def liveness(seconds_ago: float) -> lifecycle.Liveness:
    return lifecycle.Liveness(silent_before=utcnow() - timedelta(seconds=seconds_ago), hung_before=None)


def test_the_reconciler_retries_a_silent_job_only_if_it_is_still_silent(clean_store: Store) -> None:
    attempt = claimed(clean_store)
    with clean_store.session() as session:
        old = utcnow() - timedelta(seconds=120)
        session.execute(update(Job).where(Job.id == attempt.job_id).values(heartbeat_at=old))
        (dead,) = lifecycle.dead_jobs(session, liveness(60))
        lifecycle.beat(session, attempt)  # it beats between the reconciler's read and its UPDATE
        assert not lifecycle.retry(session, dead, liveness(60), "lost")
        assert not lifecycle.give_up(session, dead, liveness(60), "lost")
        assert lifecycle.cancel_dead(session, dead, liveness(60), "lost") is None
    assert job(clean_store, attempt.job_id).status is JobStatus.running
    with clean_store.session() as session:
        session.execute(update(Job).where(Job.id == attempt.job_id).values(heartbeat_at=old))
        (dead,) = lifecycle.dead_jobs(session, liveness(60))
        assert lifecycle.retry(session, dead, liveness(60), "attempt 1 lost its worker")
        assert not lifecycle.retry(session, dead, liveness(60), "twice")  # only one reconciler wins
    row = job(clean_store, attempt.job_id)
    assert row.status is JobStatus.queued and row.error == "attempt 1 lost its worker"


def test_a_job_that_beats_but_makes_no_progress_is_hung(clean_store: Store) -> None:
    attempt = claimed(clean_store)
    hung = lifecycle.Liveness(silent_before=None, hung_before=utcnow() - timedelta(seconds=60))
    with clean_store.session() as session:
        session.execute(
            update(Job)
            .where(Job.id == attempt.job_id)
            .values(progress_at=utcnow() - timedelta(seconds=600), heartbeat_at=utcnow())
        )
        assert [dead.job_id for dead in lifecycle.dead_jobs(session, hung)] == [attempt.job_id]
        assert lifecycle.dead_jobs(session, liveness(60)) == []  # its heartbeat is fresh
        lifecycle.record_progress(session, attempt, stage="perplexity", progress=0.5, detail="window 3/9")
        assert lifecycle.dead_jobs(session, hung) == []
    assert lifecycle.Liveness(None, None).dead() is None  # both tests off: nobody is dead


def test_a_cancel_between_the_reconcilers_read_and_its_update_wins_over_a_retry(clean_store: Store) -> None:
    attempt = claimed(clean_store)
    with clean_store.session() as session:
        old = utcnow() - timedelta(seconds=120)
        session.execute(update(Job).where(Job.id == attempt.job_id).values(heartbeat_at=old))
        (dead,) = lifecycle.dead_jobs(session, liveness(60))
        lifecycle.request_cancel(session, attempt.job_id)  # the user's DELETE lands in between
        assert not lifecycle.retry(session, dead, liveness(60), "lost")
        assert not lifecycle.give_up(session, dead, liveness(60), "lost")
        (dead,) = lifecycle.dead_jobs(session, liveness(60))  # the next pass reads the flag
        assert lifecycle.cancel_dead(session, dead, liveness(60), "canceled") == []
    assert job(clean_store, attempt.job_id).status is JobStatus.canceled


def test_progress_at_moves_only_when_the_reported_place_changes(clean_store: Store) -> None:
    attempt = claimed(clean_store)
    with clean_store.session() as session:
        lifecycle.record_progress(session, attempt, stage="perplexity", progress=0.5, detail="window 3/9")
    first = job(clean_store, attempt.job_id).progress_at
    with clean_store.session() as session:  # the same place again: a heartbeat, not progress
        lifecycle.record_progress(session, attempt, stage="perplexity", progress=0.5, detail="window 3/9")
    again = job(clean_store, attempt.job_id)
    assert again.progress_at == first and again.heartbeat_at is not None and again.heartbeat_at > first
    with clean_store.session() as session:
        lifecycle.record_progress(session, attempt, stage="perplexity", progress=0.55, detail="window 4/9")
    moved = job(clean_store, attempt.job_id).progress_at
    assert moved is not None and first is not None and moved > first


def test_a_job_of_a_worker_that_never_reports_progress_at_is_not_judged_hung(clean_store: Store) -> None:
    attempt = claimed(clean_store)
    hung = lifecycle.Liveness(silent_before=None, hung_before=utcnow() + timedelta(seconds=60))
    with clean_store.session() as session:
        session.execute(update(Job).where(Job.id == attempt.job_id).values(progress_at=None))
        assert lifecycle.dead_jobs(session, hung) == []  # an older worker, mid-upgrade


def test_only_passing_sqlite_errors_count_as_outages() -> None:
    import sqlite3

    from sqlalchemy.exc import OperationalError

    from core.store import is_outage

    def sqlite_error(message: str) -> OperationalError:
        return OperationalError("SELECT 1", {}, sqlite3.OperationalError(message))

    assert is_outage(sqlite_error("database is locked"))
    assert not is_outage(sqlite_error("no such table: jobs"))  # a bug, not an outage: never retried
