"""What a job's attempt owns, and the outputs that share the job's fate: the lower room of the job
lifecycle (`core.lifecycle`), which reads and deletes rows here but never writes a job's status.

An attempt may add outputs (results, fits, probe points, artifacts, profiles) only while it owns
the running job and no cancel was asked (`lock_for_output`, in the writer's transaction); a canceled
job, or a retry that starts over, deletes them (`discard_outputs`). docs/architecture.md draws the
whole path.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import ColumnElement, delete, select
from sqlalchemy.orm import Session

from core.tables import Artifact, Fit, Job, JobStatus, ProbePoint, Profile, ProfileSignal, Result

OUTPUT_TABLES = (Result, Fit, ProbePoint, Artifact, ProfileSignal, Profile)  # signals before profiles
"""Tables whose rows belong to a job (`job_id`) and share its fate."""


@dataclass(frozen=True)
class Attempt:
    """One attempt of a job: what a worker owns between its claim and its outcome."""

    job_id: str
    number: int

    def owns(self) -> ColumnElement[bool]:
        """The job is running this attempt (a superseded attempt matches no row)."""
        return (Job.id == self.job_id) & (Job.status == JobStatus.running) & (Job.attempts == self.number)


class OutputRefused(Exception):
    """The attempt may not store outputs: superseded (`superseded`), or a cancel was asked."""

    def __init__(self, superseded: bool) -> None:
        super().__init__("this attempt was superseded" if superseded else "the job was asked to cancel")
        self.superseded = superseded


def lock_for_output(session: Session, attempt: Attempt) -> None:
    """Lock the job row for the caller's transaction if this attempt may still add outputs; raise
    OutputRefused if not. On PostgreSQL a cancel request (an UPDATE of the same row) waits for the
    lock, so outputs are stored either before it, and deleted by the cancel, or not at all. SQLite has
    no row locks: there a cancel may land between this check and the insert, and the worker's next
    safe point (every output is followed by one, the outcome included) cancels and deletes them."""
    row = session.execute(select(Job.cancel_requested).where(attempt.owns()).with_for_update()).first()
    if row is None:
        raise OutputRefused(superseded=True)
    if row[0]:
        raise OutputRefused(superseded=False)


def discard_earlier_attempts(session: Session, attempt: Attempt) -> bool:
    """A retried attempt that starts over deletes what the dead attempt stored; False if this
    attempt is no longer the job's (then nothing is deleted)."""
    if session.execute(select(Job.id).where(attempt.owns()).with_for_update()).first() is None:
        return False
    discard_outputs(session, attempt.job_id)
    return True


def discard_outputs(session: Session, job_id: str) -> list[str]:
    """Delete every output row of the job; returns the artifact paths whose rows went (their files
    are the caller's to remove)."""
    paths = list(session.scalars(select(Artifact.path).where(Artifact.job_id == job_id)))
    for table in OUTPUT_TABLES:
        session.execute(delete(table).where(table.job_id == job_id))
    return paths


def state_of(session: Session, attempt: Attempt) -> tuple[JobStatus, bool] | None:
    """(status, cancel_requested) of the job while it is on this attempt, or None: how a worker tells,
    after a write whose commit it could not confirm, whether that write landed."""
    row = session.execute(
        select(Job.status, Job.cancel_requested).where(
            Job.id == attempt.job_id, Job.attempts == attempt.number
        )
    ).first()
    return None if row is None else (row[0], bool(row[1]))
