"""The life of a job, in one place: its states and one guarded transition per edge.

::

                 submit
                   |
                   v            cancel (asked before it ran)
                queued ------------------------------------------> canceled
                 |  ^                                                 ^
           claim |  | retry (reconciler: the worker went silent       | cancel (the worker, at its
                 |  |        or hung; attempts left)                  |  next safe point; the
                 v  |                                                 |  reconciler, if that worker
                running ----------------------------------------------+  died meanwhile)
                 |   |
         succeed |   | fail (the worker: a readable reason)
                 |   | give up (reconciler: silent or hung on its last attempt)
                 v   v
          succeeded   failed

`succeeded`, `failed` and `canceled` are final. While `running`, a job also carries its progress
(stage, fraction, detail, `progress_at`), its heartbeat and a `cancel_requested` flag; those writes
are guarded like the transitions but leave the state as it is.

Every transition is one conditional UPDATE whose WHERE clause names the state it leaves, and, for
a worker, the attempt it owns; the reconciler's retry and give-up also re-check, in the same
statement, that the job is still silent or hung. So API replicas, reconcilers and a worker that
was superseded while it was silent can race freely: exactly one of them wins, and the others learn
it from the row count. Nothing else in the code writes `jobs.status` (a test checks).

A job's outputs (results, fits, probe points, artifacts) follow its life: they are written only
while the writing attempt owns the running job and no cancel was asked (`core.job_outputs`, in the
writer's transaction); a canceled job keeps none of them (deleted in the cancel's transaction); a
retried attempt of a kind that starts over deletes what its dead attempt wrote. Other jobs may
reuse only outputs of succeeded jobs (see `workers.kinds.steps.find_dense_baseline`), so no
deletion here ever removes a row another job refers to. docs/architecture.md draws the whole path.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import ColumnElement, CursorResult, case, func, or_, select, update
from sqlalchemy.orm import Session

from core.job_outputs import Attempt, discard_outputs
from core.tables import Job, JobStatus, utcnow


def _changed(session: Session, statement: Any) -> bool:
    result = session.execute(statement)
    return bool(cast(CursorResult[Any], result).rowcount)


# ----------------------------------------------------------------------------- queued -> ...


def request_digest(body: dict[str, Any]) -> str:
    """SHA-256 of a job request's canonical JSON (what an idempotent resubmission must repeat)."""
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def submit(
    session: Session,
    *,
    kind: str,
    request: dict[str, Any],
    model_id: str,
    request_hash: str,
    idempotency_key: str | None = None,
    parent_id: str | None = None,
) -> Job:
    """A new `queued` job row (flushed, so it has its id); the caller's transaction commits it
    before anything is enqueued, so the queue never holds an id the store lacks. `parent_id`
    names the job that created it (a fanned-out sweep's children): canceling the parent cancels it."""
    job = Job(
        kind=kind,
        request=request,
        model_id=model_id,
        idempotency_key=idempotency_key,
        request_hash=request_hash,
        status=JobStatus.queued,
        parent_id=parent_id,
    )
    session.add(job)
    session.flush()
    return job


def mark_enqueued(session: Session, job_id: str, now: datetime | None = None) -> bool:
    """Record that the transport holds the queued job (the reconciler's grace starts here)."""
    return _changed(
        session,
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.queued)
        .values(enqueued_at=now or utcnow()),
    )


def claim(session: Session, job_id: str, worker: str, now: datetime | None = None) -> Attempt | None:
    """queued -> running for `worker`: the next attempt, or None if the job is not queued (taken by
    another worker, canceled, finished, or a stale delivery)."""
    now = now or utcnow()
    row = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.queued)
        .values(
            status=JobStatus.running,
            attempts=Job.attempts + 1,
            started_at=now,
            heartbeat_at=now,
            progress_at=now,
            stage="starting",
            progress=0.0,
            detail=None,
            worker=worker,
        )
        .returning(Job.attempts)
    ).first()
    return None if row is None else Attempt(job_id, int(row[0]))


class CancelOutcome(enum.Enum):
    CANCELED = "canceled"  # it was queued: it will never run
    REQUESTED = "requested"  # it is running: it stops at its next safe point
    FINISHED = "finished"  # already final: nothing to cancel
    MISSING = "missing"  # no such job


@dataclass(frozen=True)
class CancelRequest:
    outcome: CancelOutcome
    removed: list[str]  # artifact paths whose rows went with the job (their files are the caller's)


def request_cancel(session: Session, job_id: str, now: datetime | None = None) -> CancelRequest:
    """A user's cancel: queued -> canceled at once (with anything an earlier attempt stored), or,
    for a running job, the flag its worker sees at its next safe point. The job's children that
    are not final are canceled the same way, in the same transaction; their removed artifact
    paths are returned with the job's."""
    now = now or utcnow()
    request = _cancel_one(session, job_id, now)
    removed = list(request.removed)
    for child in session.scalars(
        select(Job.id).where(Job.parent_id == job_id, Job.status.in_((JobStatus.queued, JobStatus.running)))
    ).all():
        removed += _cancel_one(session, child, now).removed
    return CancelRequest(request.outcome, removed)


def children_of(session: Session, job_id: str) -> Sequence[Job]:
    """The jobs `job_id` created, oldest first."""
    return session.scalars(select(Job).where(Job.parent_id == job_id).order_by(Job.created_at, Job.id)).all()


def _cancel_one(session: Session, job_id: str, now: datetime) -> CancelRequest:
    if _changed(
        session,
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.queued)
        .values(
            status=JobStatus.canceled,
            stage="canceled",
            finished_at=now,
            cancel_requested=True,
            error="canceled by request before it ran",
        ),
    ):
        return CancelRequest(CancelOutcome.CANCELED, discard_outputs(session, job_id))
    if _changed(
        session,
        update(Job).where(Job.id == job_id, Job.status == JobStatus.running).values(cancel_requested=True),
    ):
        return CancelRequest(CancelOutcome.REQUESTED, [])
    exists = session.scalar(select(Job.id).where(Job.id == job_id))
    return CancelRequest(CancelOutcome.FINISHED if exists is not None else CancelOutcome.MISSING, [])


# ------------------------------------------------------------------------- while running (worker)


def record_progress(
    session: Session,
    attempt: Attempt,
    *,
    stage: str,
    progress: float,
    detail: str | None,
    now: datetime | None = None,
) -> bool:
    """Where the attempt is (also a heartbeat); False if the attempt no longer owns the job.
    `progress_at` moves only when stage, fraction or detail changes: a loop that keeps reporting the
    same place is as hung as one that reports nothing."""
    now = now or utcnow()
    progress = max(0.0, min(1.0, progress))
    moved = or_(Job.stage != stage, Job.progress != progress, Job.detail.is_distinct_from(detail))
    return _changed(
        session,
        update(Job)
        .where(attempt.owns())
        .values(
            stage=stage,
            progress=progress,
            detail=detail,
            progress_at=case((moved, now), else_=Job.progress_at),
            heartbeat_at=now,
        ),
    )


def beat(session: Session, attempt: Attempt, now: datetime | None = None) -> bool | None:
    """A heartbeat: whether a cancel was asked, or None if the attempt no longer owns the job."""
    row = session.execute(
        update(Job).where(attempt.owns()).values(heartbeat_at=now or utcnow()).returning(Job.cancel_requested)
    ).first()
    return None if row is None else bool(row[0])


def record_environment(session: Session, attempt: Attempt, environment: dict[str, Any]) -> bool:
    """Versions and device of the run, on the job."""
    return _changed(session, update(Job).where(attempt.owns()).values(environment=environment))


# ------------------------------------------------------------------------- running -> final (worker)


def succeed(session: Session, attempt: Attempt, now: datetime | None = None) -> bool:
    """running -> succeeded, unless a cancel was asked meanwhile (then False: cancel instead). The
    error an earlier attempt left ("attempt 1 lost its worker") is cleared."""
    return _changed(
        session,
        update(Job)
        .where(attempt.owns(), Job.cancel_requested.is_(False))
        .values(
            status=JobStatus.succeeded,
            stage="done",
            progress=1.0,
            detail=None,
            error=None,
            finished_at=now or utcnow(),
        ),
    )


def fail(session: Session, attempt: Attempt, reason: str, now: datetime | None = None) -> bool:
    """running -> failed with the reason, for the attempt that owns the job."""
    return _changed(
        session,
        update(Job)
        .where(attempt.owns())
        .values(status=JobStatus.failed, stage="failed", error=reason, finished_at=now or utcnow()),
    )


def cancel(session: Session, attempt: Attempt, now: datetime | None = None) -> list[str] | None:
    """running -> canceled at a safe point after a cancel request, deleting the job's outputs in the
    same transaction; the artifact paths to remove, or None if the attempt no longer owns the job."""
    if not _changed(
        session,
        update(Job)
        .where(attempt.owns())
        .values(
            status=JobStatus.canceled,
            stage="canceled",
            error="canceled by request",
            finished_at=now or utcnow(),
        ),
    ):
        return None
    return discard_outputs(session, attempt.job_id)


# ----------------------------------------------------------------- running -> ... (the reconciler)


@dataclass(frozen=True)
class Liveness:
    """When a running job counts as dead: no heartbeat since `silent_before` or no progress since
    `hung_before` (None: that test is off, e.g. while the store was not reachable long enough)."""

    silent_before: datetime | None
    hung_before: datetime | None

    def dead(self) -> ColumnElement[bool] | None:
        tests = []
        if self.silent_before is not None:
            tests.append(func.coalesce(Job.heartbeat_at, Job.started_at, Job.created_at) < self.silent_before)
        if self.hung_before is not None:
            # No progress_at: a worker from before it existed, which cannot be judged hung.
            tests.append(Job.progress_at.is_not(None) & (Job.progress_at < self.hung_before))
        if not tests:
            return None
        return tests[0] if len(tests) == 1 else tests[0] | tests[1]


@dataclass(frozen=True)
class DeadJob:
    """A running job the reconciler found silent or hung, as it read it."""

    job_id: str
    attempts: int
    cancel_requested: bool
    heartbeat_at: datetime | None
    progress_at: datetime | None
    stage: str
    detail: str | None


def dead_jobs(session: Session, liveness: Liveness) -> Sequence[DeadJob]:
    """Running jobs whose worker is silent or hung by `liveness`."""
    dead = liveness.dead()
    if dead is None:
        return []
    rows = session.execute(
        select(
            Job.id,
            Job.attempts,
            Job.cancel_requested,
            Job.heartbeat_at,
            Job.progress_at,
            Job.stage,
            Job.detail,
        ).where(Job.status == JobStatus.running, dead)
    ).all()
    return [DeadJob(*row) for row in rows]


def _still_dead(job: DeadJob, liveness: Liveness, *, cancel_requested: bool) -> ColumnElement[bool]:
    """The job is still running the attempt the reconciler read, still dead, and still (not) asked
    to cancel: a cancel that lands between the read and the UPDATE turns a retry into a no-op, and
    the next pass cancels the job instead."""
    dead = liveness.dead()
    assert dead is not None
    return (
        (Job.id == job.job_id)
        & (Job.status == JobStatus.running)
        & (Job.attempts == job.attempts)
        & (Job.cancel_requested.is_(cancel_requested))
        & dead
    )


def retry(
    session: Session, job: DeadJob, liveness: Liveness, reason: str, now: datetime | None = None
) -> bool:
    """running -> queued for another attempt, if the job is still dead by `liveness` (re-checked in
    the statement: a worker that beat meanwhile keeps its job)."""
    now = now or utcnow()
    return _changed(
        session,
        update(Job)
        .where(_still_dead(job, liveness, cancel_requested=False))
        .values(
            status=JobStatus.queued,
            stage="queued",
            progress=0.0,
            detail=None,
            worker=None,
            enqueued_at=now,
            error=reason,
        ),
    )


def give_up(
    session: Session, job: DeadJob, liveness: Liveness, reason: str, now: datetime | None = None
) -> bool:
    """running -> failed when the dead job had no attempts left (re-checked like `retry`)."""
    return _changed(
        session,
        update(Job)
        .where(_still_dead(job, liveness, cancel_requested=False))
        .values(status=JobStatus.failed, stage="failed", finished_at=now or utcnow(), error=reason),
    )


def cancel_dead(
    session: Session, job: DeadJob, liveness: Liveness, reason: str, now: datetime | None = None
) -> list[str] | None:
    """running -> canceled for a dead job that had been asked to cancel, deleting its outputs;
    the artifact paths to remove, or None if it is no longer dead (re-checked like `retry`)."""
    if not _changed(
        session,
        update(Job)
        .where(_still_dead(job, liveness, cancel_requested=True))
        .values(status=JobStatus.canceled, stage="canceled", finished_at=now or utcnow(), error=reason),
    ):
        return None
    return discard_outputs(session, job.job_id)
