"""A running job's handle on the store: claim, progress, heartbeat, cancellation, outcome.

Every write is guarded by (status = running, attempts = this attempt): if the reconciler gave
the job to another worker after this one went silent, this worker's late writes change nothing
and it stops at its next safe point.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import structlog
from sqlalchemy import Delete, delete, select, update

from app.config import Settings
from app.db import Store
from app.tables import Artifact, Fit, Job, JobStatus, ProbePoint, Result, utcnow

log = structlog.get_logger(__name__)

# Progress writes closer together than this are coalesced (stage changes always go through).
PROGRESS_MIN_INTERVAL_S = 0.5


class JobStopped(Exception):
    """The job must stop: canceled by a user, or taken over after this worker went silent."""


class JobFailure(Exception):
    """A failure whose message is meant for the user as it is (bad model, missing data...)."""


class JobContext:
    def __init__(self, store: Store, settings: Settings, job: Job) -> None:
        self.store = store
        self.settings = settings
        self.job_id = job.id
        self.kind = job.kind
        self.request: dict[str, Any] = dict(job.request)
        self.attempt = job.attempts
        self.log = log.bind(job_id=job.id, kind=job.kind, attempt=job.attempts)
        self._cancel_seen = False
        self._superseded = False
        self._last_progress_write = 0.0
        self._stage = "starting"

    @classmethod
    def claim(cls, store: Store, settings: Settings, job_id: str) -> JobContext | None:
        """Move a queued job to running for this worker; None if it is not ours to run."""
        worker = f"{socket.gethostname()}:{os.getpid()}"
        now = utcnow()
        with store.session() as session:
            changed = session.execute(
                update(Job)
                .where(Job.id == job_id, Job.status == JobStatus.queued.value)
                .values(
                    status=JobStatus.running.value,
                    attempts=Job.attempts + 1,
                    started_at=now,
                    heartbeat_at=now,
                    stage="starting",
                    progress=0.0,
                    detail=None,
                    worker=worker,
                )
            ).rowcount  # type: ignore[attr-defined]
            if not changed:
                return None
            job = session.get(Job, job_id)
        assert job is not None
        return cls(store, settings, job)

    def _guard(self) -> Any:
        return (
            (Job.id == self.job_id) & (Job.status == JobStatus.running.value) & (Job.attempts == self.attempt)
        )

    def _write(self, **values: Any) -> bool:
        with self.store.session() as session:
            changed = session.execute(update(Job).where(self._guard()).values(**values)).rowcount  # type: ignore[attr-defined]
        if not changed:
            self._superseded = True
        return bool(changed)

    # -- progress and stopping -------------------------------------------------------------
    def report(self, stage: str, progress: float, detail: str | None = None) -> None:
        """Record where the job is; raises JobStopped at this safe point if it must stop."""
        now = time.monotonic()
        if stage != self._stage or now - self._last_progress_write >= PROGRESS_MIN_INTERVAL_S:
            self._stage = stage
            self._last_progress_write = now
            self._write(stage=stage, progress=max(0.0, min(1.0, progress)), detail=detail)
            self.log.info("progress", stage=stage, progress=round(progress, 4), detail=detail)
        self.check_stop()

    @property
    def superseded(self) -> bool:
        return self._superseded

    @property
    def cancel_seen(self) -> bool:
        return self._cancel_seen

    def should_stop(self) -> bool:
        return self._cancel_seen or self._superseded

    def check_stop(self) -> None:
        if self._superseded:
            raise JobStopped("this attempt was superseded after its heartbeat lapsed")
        if self._cancel_seen:
            raise JobStopped("canceled by request")

    @contextmanager
    def heartbeat(self) -> Iterator[None]:
        """Beat every heartbeat_interval_s in a thread, picking up cancel requests as it goes."""
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self.settings.heartbeat_interval_s):
                try:
                    self._beat_once()
                except Exception:
                    self.log.warning("heartbeat write failed; will retry", exc_info=True)

        thread = threading.Thread(target=beat, name=f"heartbeat-{self.job_id}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=5)

    def _beat_once(self) -> None:
        if not self._write(heartbeat_at=utcnow()):
            return
        with self.store.session() as session:
            requested = session.scalar(select(Job.cancel_requested).where(Job.id == self.job_id))
        if requested:
            self._cancel_seen = True

    # -- outputs ---------------------------------------------------------------------------
    def set_environment(self, environment: dict[str, Any]) -> None:
        self._write(environment=environment)

    def discard_earlier_attempts(self) -> None:
        """Delete what earlier attempts of this job stored, so a retry does not store it twice."""
        with self.store.session() as session:
            if session.scalar(select(Job.id).where(self._guard()).with_for_update()) is None:
                self._superseded = True
                raise JobStopped("this attempt was superseded before it started")
            for table in (Result, Artifact, Fit, ProbePoint):
                session.execute(delete(table).where(table.job_id == self.job_id))

    def add_results(self, results: Sequence[Result]) -> None:
        """Store results for this job, unless this attempt has been superseded."""
        self._add_rows(results, "results")

    def add_artifacts(self, artifacts: Sequence[Artifact]) -> None:
        """Record files this job wrote (e.g. a sliced model), unless this attempt was superseded. A
        folder written again (a resumed sweep re-measuring a sparsity) replaces its earlier row."""
        rewritten = delete(Artifact).where(
            Artifact.job_id == self.job_id, Artifact.path.in_([artifact.path for artifact in artifacts])
        )
        self._add_rows(artifacts, "artifacts", replacing=rewritten)

    def add_fits(self, fits: Sequence[Fit]) -> None:
        """Record laws fitted to this job's points, unless this attempt was superseded."""
        self._add_rows(fits, "fits")

    def add_probe_points(self, points: Sequence[ProbePoint]) -> None:
        """Record a probe's measurements, unless this attempt was superseded."""
        self._add_rows(points, "probe points")

    def _add_rows(
        self,
        rows: Sequence[Result | Artifact | Fit | ProbePoint],
        what: str,
        *,
        replacing: Delete | None = None,
    ) -> None:
        """Add rows in one transaction guarded by this attempt's ownership, after `replacing` (rows
        the new ones supersede) is deleted in the same transaction."""
        with self.store.session() as session:
            owner = session.scalar(select(Job.id).where(self._guard()).with_for_update())
            if owner is None:
                self._superseded = True
                raise JobStopped(f"this attempt was superseded; its {what} are discarded")
            if replacing is not None:
                session.execute(replacing)
            for row in rows:
                row.job_id = self.job_id
                session.add(row)

    # -- outcome ---------------------------------------------------------------------------
    def succeed(self) -> None:
        self._finish(JobStatus.succeeded, stage="done", progress=1.0)

    def fail(self, reason: str) -> None:
        self._finish(JobStatus.failed, stage="failed", error=reason)

    def cancel(self) -> None:
        self._finish(JobStatus.canceled, stage="canceled", error="canceled by request")

    def _finish(self, status: JobStatus, **values: Any) -> None:
        if self._write(status=status.value, finished_at=utcnow(), **values):
            self.log.info("job finished", status=status.value, error=values.get("error"))
        else:
            self.log.warning("job outcome not recorded: attempt superseded", status=status.value)
