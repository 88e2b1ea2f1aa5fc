"""A running job's handle on the store: progress, heartbeat, cancellation, outputs and outcome.

Every write goes through `core.lifecycle`, guarded by this attempt's ownership: if the reconciler
gave the job to another worker after this one went silent, this worker's late writes change
nothing and it stops at its next safe point.

The store may go away for a few seconds while a job runs. Progress and heartbeats are best effort
(a write that fails is logged and the next one carries on); outputs, reads and the outcome are
retried for `store_retry_s`. Only when the store stays away longer than that does the attempt give
up without an outcome: the job stays `running`, its heartbeat stops, and the reconciler retries it
once the store is back (`StoreUnavailable` reaches `workers.tasks`).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import structlog
from sqlalchemy import Delete, delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from core import job_outputs, lifecycle
from core.artifacts import remove_job_files
from core.settings import Settings
from core.store import Store, is_outage
from core.tables import Artifact, Fit, Job, JobStatus, ProbePoint, Profile, Result

log = structlog.get_logger(__name__)

T = TypeVar("T")

PROGRESS_MIN_INTERVAL_S = 0.5
"""Progress writes closer together than this are coalesced (stage changes always go through)."""
PROGRESS_OUTAGE_PAUSE_S = 2.0
"""After a progress write fails, skip progress writes this long (the job keeps working)."""


class JobStopped(Exception):
    """The job must stop: canceled by a user, or taken over after this worker went silent."""


class JobFailure(Exception):
    """A failure whose message is meant for the user as it is (bad model, missing data...)."""


class JobContext:
    def __init__(self, store: Store, settings: Settings, job: Job, attempt: job_outputs.Attempt) -> None:
        self.store = store
        self.settings = settings
        self.job_id = job.id
        self.parent_id = job.parent_id  # the job that created this one (a fanned-out sweep), if any
        self.kind = job.kind
        self.request: dict[str, Any] = dict(job.request)
        self.attempt = attempt.number
        self._attempt = attempt
        self.log = log.bind(job_id=job.id, kind=job.kind, attempt=attempt.number)
        self._cancel_seen = False
        self._superseded = False
        self._last_progress_write = 0.0
        self._progress_paused_until = 0.0
        self._stage = "starting"

    @classmethod
    def claim(cls, store: Store, settings: Settings, job_id: str) -> JobContext | None:
        """Move a queued job to running for this worker; None if it is not ours to run."""
        worker = f"{socket.gethostname()}:{os.getpid()}"

        def claim_it(session: Session) -> tuple[Job, job_outputs.Attempt] | None:
            attempt = lifecycle.claim(session, job_id, worker)
            if attempt is None:
                return None
            job = session.get(Job, job_id)
            assert job is not None
            return job, attempt

        claimed = store.retrying(claim_it, within_s=settings.store_retry_s, what="claiming the job")
        return None if claimed is None else cls(store, settings, *claimed)

    # -- store access ------------------------------------------------------------------------
    def _must(self, work: Callable[[Session], T], what: str) -> T:
        """A write or read the job cannot go on without: retried through an outage."""
        return self.store.retrying(work, within_s=self.settings.store_retry_s, what=what)

    def read(self, work: Callable[[Session], T], what: str) -> T:
        """Run a read of the job's own (e.g. the dense baseline to reuse) through outages."""
        return self._must(work, what)

    def _best_effort(self, work: Callable[[Session], T], what: str) -> T | None:
        """A write the job can do without (progress, environment): one try; an outage is logged."""
        try:
            with self.store.session() as session:
                return work(session)
        except Exception as error:
            if not is_outage(error):
                raise
            self.log.warning("store unreachable; carrying on without this write", what=what)
            return None

    def write_cache(self, work: Callable[[Session], None], what: str) -> None:
        """Keep what a later job may reuse but can recompute (one try; an outage is logged).

        A cache write refused by the store's constraints (e.g. the row it hangs on was deleted while
        the job ran) is logged and dropped too: the job's own outcome must not turn on its cache."""
        try:
            self._best_effort(work, what)
        except IntegrityError as error:
            self.log.warning(
                "the store refused a cache write; carrying on without it", what=what, reason=str(error.orig)
            )

    # -- progress and stopping -------------------------------------------------------------
    def report(self, stage: str, progress: float, detail: str | None = None) -> None:
        """Record where the job is; raises JobStopped at this safe point if it must stop."""
        now = time.monotonic()
        due = stage != self._stage or now - self._last_progress_write >= PROGRESS_MIN_INTERVAL_S
        if due and now >= self._progress_paused_until:
            self._stage = stage
            self._last_progress_write = now
            owned = self._best_effort(
                lambda session: lifecycle.record_progress(
                    session, self._attempt, stage=stage, progress=progress, detail=detail
                ),
                "progress",
            )
            if owned is None:
                self._progress_paused_until = now + PROGRESS_OUTAGE_PAUSE_S
            elif not owned:
                self._superseded = True
            self.log.info("progress", stage=stage, progress=round(progress, 4), detail=detail)
        self.check_stop()

    @property
    def superseded(self) -> bool:
        return self._superseded

    @property
    def cancel_seen(self) -> bool:
        return self._cancel_seen

    def check_in(self) -> None:
        """Beat now (reading a cancel request at once, not at the next heartbeat) and raise
        JobStopped if this job must stop: for a job that waits on others."""
        self._beat_once()
        self.check_stop()

    def should_stop(self) -> bool:
        return self._cancel_seen or self._superseded

    def check_stop(self) -> None:
        if self._superseded:
            raise JobStopped("this attempt was superseded after its heartbeat lapsed")
        if self._cancel_seen:
            raise JobStopped("canceled by request")

    @contextmanager
    def heartbeat(self, on_superseded: Callable[[], None] | None = None) -> Iterator[None]:
        """Beat every heartbeat_interval_s in a thread, picking up cancel requests as it goes. When a
        beat finds the attempt superseded, `on_superseded` runs once in that thread."""
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self.settings.heartbeat_interval_s):
                try:
                    self._beat_once()
                except Exception:
                    self.log.warning("heartbeat write failed; will retry", exc_info=True)
                if self._superseded and on_superseded is not None:
                    on_superseded()
                    return

        thread = threading.Thread(target=beat, name=f"heartbeat-{self.job_id}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=5)

    def _beat_once(self) -> None:
        try:
            with self.store.session() as session:
                cancel = lifecycle.beat(session, self._attempt)
        except Exception as error:
            if not is_outage(error):
                raise
            self.log.warning("store unreachable; heartbeat skipped")
            return
        if cancel is None:
            self._superseded = True  # another attempt owns the job now
        elif cancel:
            self._cancel_seen = True

    # -- outputs ---------------------------------------------------------------------------
    def set_environment(self, environment: dict[str, Any]) -> None:
        self._best_effort(
            lambda session: lifecycle.record_environment(session, self._attempt, environment), "environment"
        )

    def discard_earlier_attempts(self) -> None:
        """Delete what earlier attempts of this job stored, so a retry does not store it twice."""
        owned = self._must(
            lambda session: job_outputs.discard_earlier_attempts(session, self._attempt),
            "discarding an earlier attempt's outputs",
        )
        if not owned:
            self._superseded = True
            raise JobStopped("this attempt was superseded before it started")

    def add_results(self, results: Sequence[Result]) -> None:
        """Store results for this job, unless this attempt was superseded or asked to cancel."""
        self._add_rows(results, "results")

    def add_artifacts(self, artifacts: Sequence[Artifact]) -> None:
        """Record files this job wrote (e.g. a sliced model). A folder written again (a resumed sweep
        re-measuring a sparsity) replaces its earlier row."""
        paths = [artifact.path for artifact in artifacts]
        rewritten = delete(Artifact).where(Artifact.job_id == self.job_id, Artifact.path.in_(paths))
        self._add_rows(artifacts, "artifacts", replacing=rewritten)

    def add_children(self, kind: str, requests: Sequence[dict[str, Any]], model_id: str) -> list[str]:
        """Create one queued job of `kind` per request, children of this job (canceling this job
        cancels them), in one transaction that checks this attempt still owns the job and no
        cancel was asked; returns their ids. The caller enqueues them (the reconciler would)."""

        def create(session: Session) -> list[str]:
            job_outputs.lock_for_output(session, self._attempt)
            children = [
                lifecycle.submit(
                    session,
                    kind=kind,
                    request=request,
                    model_id=model_id,
                    request_hash=lifecycle.request_digest(request),
                    parent_id=self.job_id,
                )
                for request in requests
            ]
            return [child.id for child in children]

        try:
            return self._must(create, "creating child jobs")
        except job_outputs.OutputRefused as refused:
            self._superseded = refused.superseded
            self._cancel_seen = not refused.superseded
            raise JobStopped("this attempt may not create jobs any more") from refused

    def add_fits(self, fits: Sequence[Fit]) -> None:
        """Record laws fitted to this job's points."""
        self._add_rows(fits, "fits")

    def add_probe_points(self, points: Sequence[ProbePoint]) -> None:
        """Record a probe's measurements."""
        self._add_rows(points, "probe points")

    def add_profiles(self, profiles: Sequence[Profile]) -> None:
        """Record dense profiles, their signals with them."""
        for profile in profiles:
            for signal in profile.signals:
                signal.job_id = self.job_id
        self._add_rows(profiles, "profiles")

    def _add_rows(
        self,
        rows: Sequence[Result | Artifact | Fit | ProbePoint | Profile],
        what: str,
        *,
        replacing: Delete | None = None,
    ) -> None:
        """Add rows in one transaction that first locks the job row and checks this attempt still
        owns it and no cancel was asked (`job_outputs.lock_for_output`), after `replacing` (rows the
        new ones supersede) is deleted in the same transaction."""
        job_id = self.job_id

        def add(session: Session) -> None:
            job_outputs.lock_for_output(session, self._attempt)
            if _already_stored(session, rows):
                return  # an earlier try committed, but the connection died before it could say so
            if replacing is not None:
                session.execute(replacing)
            session.add_all([_with_job(row, job_id) for row in rows])

        try:
            self._must(add, f"storing {what}")
        except job_outputs.OutputRefused as refused:
            if refused.superseded:
                self._superseded = True
                raise JobStopped(f"this attempt was superseded; its {what} are discarded") from refused
            self._cancel_seen = True
            raise JobStopped(f"canceled by request; its {what} are discarded") from refused

    # -- outcome ---------------------------------------------------------------------------
    # An outcome write is retried through outages; when its commit landed but the connection died
    # before it could say so, the retry finds the job already final, which `_landed` recognises.

    def succeed(self) -> None:
        """The job's outcome: succeeded, or canceled if a cancel arrived after the last safe point."""
        if self._must(lambda session: lifecycle.succeed(session, self._attempt), "recording success"):
            self.log.info("job finished", status="succeeded")
            return
        state = self._landed()
        if state is not None and state[0] is JobStatus.succeeded:
            self.log.info("job finished", status="succeeded")
        elif state is not None and state[0] is JobStatus.running and state[1]:
            self.cancel()  # succeed refuses a job asked to cancel: the cancel wins
        else:
            self.log.warning("job outcome not recorded: attempt superseded", status="succeeded")

    def fail(self, reason: str) -> None:
        recorded = self._must(
            lambda session: lifecycle.fail(session, self._attempt, reason), "recording failure"
        )
        state = None if recorded else self._landed()
        if recorded or (state is not None and state[0] is JobStatus.failed):
            self.log.info("job finished", status="failed", error=reason)
        else:
            self.log.warning("job outcome not recorded: attempt superseded", status="failed")

    def cancel(self) -> None:
        """Canceled at a safe point: nothing it stored stays, its artifact folders included."""
        paths = self._must(lambda session: lifecycle.cancel(session, self._attempt), "recording the cancel")
        state = None if paths is not None else self._landed()
        if paths is None and (state is None or state[0] is not JobStatus.canceled):
            self.log.warning("job outcome not recorded: attempt superseded", status="canceled")
            return
        remove_job_files(self.settings, self.job_id, paths or ())
        self.log.info("job finished", status="canceled")

    def _landed(self) -> tuple[JobStatus, bool] | None:
        return self._must(lambda session: job_outputs.state_of(session, self._attempt), "reading the outcome")


def _already_stored(session: Session, rows: Sequence[Any]) -> bool:
    """Whether these rows (given ids by a flush whose commit went unconfirmed) are in the store."""
    first = next((row for row in rows if getattr(row, "id", None) is not None), None)
    if first is None:
        return False
    table = type(first)
    return session.scalar(select(table.id).where(table.id == first.id)) is not None


def _with_job(row: Any, job_id: str) -> Any:
    row.job_id = job_id
    return row
