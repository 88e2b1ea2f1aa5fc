"""What the jobs endpoints do, apart from HTTP: check a submission, store and enqueue it, cancel.

POST /v1/jobs and POST /v1/predictions (`measure_missing`) both submit through `create_job`. Every
state change goes through `core.lifecycle`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import structlog
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.deps import Services
from app.problems import ProblemError
from app.queueing import QueueUnavailable
from core import lifecycle
from core.artifacts import remove_job_files
from core.methods import METHODS
from core.model_sources import ModelSource, ModelSourceError, resolve_model
from core.specs import JobCreate, ProbeJobCreate, ProfileJobCreate, PruneJobCreate, SweepJobCreate
from core.specs.profile import MASK_PROFILED_METHOD, PROFILED_METHOD
from core.specs.simulate import SimulateJobCreate
from core.store import is_outage
from core.tables import Artifact, Job, JobStatus, Result

log = structlog.get_logger(__name__)


def get_job(session: Session, job_id: str) -> Job:
    """The job, or a 404 problem."""
    job = session.get(Job, job_id)
    if job is None:
        raise ProblemError(404, f"no job with id {job_id!r}", slug="job-not-found")
    return job


def job_results(session: Session, job_id: str) -> Sequence[Result]:
    """The results a job stored, with those of the jobs it created (a fanned-out sweep's points are
    stored by its per-sparsity children), oldest first."""
    children = select(Job.id).where(Job.parent_id == job_id)
    query = select(Result).where((Result.job_id == job_id) | Result.job_id.in_(children))
    return session.scalars(query.order_by(Result.id)).all()


def create_job(services: Services, job: JobCreate, idempotency_key: str | None = None) -> tuple[Job, bool]:
    """Check, store and enqueue a job. Returns the row and whether it replays an earlier submission
    with the same Idempotency-Key (the same key with a different body is a 422).

    The model is checked at once: an unknown alias, a path outside the model roots or an HF id
    missing from the local cache is a 422 here rather than a failed job later; so is a model the
    pruning method cannot handle, when its config is at hand.
    """
    try:
        source = resolve_model(job.model, services.settings, job.revision)
    except ModelSourceError as error:
        raise ProblemError(422, str(error), slug="invalid-model", title="Model not usable") from error
    check_submission(services, job, source)
    body = job.model_dump(mode="json")
    digest = lifecycle.request_digest(body)
    with services.store.session() as session:
        if idempotency_key is not None:
            existing = session.scalar(select(Job).where(Job.idempotency_key == idempotency_key))
            if existing is not None:
                return _replay(existing, digest), True
        try:
            row = lifecycle.submit(
                session,
                kind=job.kind,
                request=body,
                model_id=source.model_id,
                request_hash=digest,
                idempotency_key=idempotency_key,
            )
        except IntegrityError:
            session.rollback()
            existing = (
                session.scalar(select(Job).where(Job.idempotency_key == idempotency_key))
                if idempotency_key is not None
                else None
            )
            if existing is None:
                raise  # not a concurrent replay: a real constraint violation
            return _replay(existing, digest), True
    # The row is committed before the enqueue: a crash in between leaves a queued job that the
    # reconciler enqueues, never a queue entry without a job.
    try:
        services.queue.enqueue(row.id)
        with services.store.session() as session:
            lifecycle.mark_enqueued(session, row.id)
    except Exception as error:
        if not isinstance(error, QueueUnavailable) and not is_outage(error):
            raise
        # The job is stored (and maybe enqueued): answering an error now would invite a duplicate.
        log.warning(
            "enqueue not confirmed at submit; the reconciler will see to the job",
            job_id=row.id,
            error=str(error),
        )
    log.info("job submitted", job_id=row.id, kind=row.kind, model=row.model_id)
    return row, False


def _replay(existing: Job, digest: str) -> Job:
    if existing.request_hash != digest:
        raise ProblemError(
            422,
            "this Idempotency-Key was already used with a different request body",
            slug="idempotency-key-reused",
            job_id=existing.id,
        )
    return existing


def check_submission(services: Services, job: JobCreate, source: ModelSource) -> None:
    """Refuse now what the worker would refuse later: a model the method cannot prune (when its
    config is at hand; for a profile, slicing), and a probe's artifact job that has no artifact."""
    if isinstance(job, PruneJobCreate | SweepJobCreate):
        sparsities = [job.sparsity] if isinstance(job, PruneJobCreate) else job.sparsities
        check_prunable(source, job.method, sparsities, job.round_to, job.layout)
    elif isinstance(job, ProbeJobCreate):
        if job.method is not None and job.sparsity is not None:
            check_prunable(source, job.method, [job.sparsity], job.round_to, job.layout)
        if job.artifact_job_id is not None:
            with services.store.sessions() as session:
                check_artifact_job(session, job.artifact_job_id, source.model_id)
    elif isinstance(job, SimulateJobCreate):
        check_prunable(source, job.method, job.sparsities + job.anchors, job.round_to, job.layout)
    elif isinstance(job, ProfileJobCreate):
        check_profilable(source, job.sparsities, job.round_to)


def check_prunable(
    source: ModelSource, method: str, sparsities: Sequence[float], round_to: int, layout: str | None = None
) -> None:
    """The method's refusal of this model (in this layout), from its config, as a 422. Packaged
    models carry no config.json here (they are GGUF); they are known to be prunable."""
    if source.config is None:
        return
    refusal = METHODS[method].refusal(source.config, sparsities, round_to, layout)
    if refusal is not None:
        raise ProblemError(422, refusal.reason, slug=refusal.slug, title=refusal.title)


def check_profilable(source: ModelSource, sparsities: Sequence[float], round_to: int) -> None:
    """A profile measures what slicing would discard and what the masks would remove: a model slicing
    refuses for its architecture is still profiled (block outputs and mask errors) when the
    intra-layer pruners take it; sparsities slicing refuses are refused."""
    if source.config is None:
        return
    refusal = METHODS[PROFILED_METHOD].refusal(source.config, sparsities, round_to)
    if refusal is not None and refusal.slug == "unsupported-architecture":
        refusal = METHODS[MASK_PROFILED_METHOD].refusal(source.config, sparsities, round_to)
    if refusal is not None:
        raise ProblemError(422, refusal.reason, slug=refusal.slug, title=refusal.title)


def check_artifact_job(session: Session, artifact_job_id: str, model_id: str) -> None:
    """A probe's `artifact_job_id` must be a succeeded `prune` job of the same model with an artifact:
    422 when there is no such job or its model differs, 409 when it has (or cannot yet have) none."""
    source_job = session.get(Job, artifact_job_id)
    common: dict[str, Any] = {
        "slug": "artifact-unavailable",
        "title": "No artifact to probe",
        "artifact_job_id": artifact_job_id,
    }
    if source_job is None:
        raise ProblemError(
            422,
            f"artifact_job_id: no job with id {artifact_job_id!r}; name a succeeded prune job "
            "(GET /v1/jobs?kind=prune&status=succeeded)",
            slug="artifact-job-not-found",
            title="No such artifact job",
            artifact_job_id=artifact_job_id,
        )
    if source_job.kind != "prune":
        raise ProblemError(
            409,
            f"artifact_job_id: job {artifact_job_id} is a {source_job.kind} job; only prune jobs save a "
            "pruned model to probe",
            kind=source_job.kind,
            **common,
        )
    if source_job.model_id != model_id:
        raise ProblemError(
            422,
            f"artifact_job_id: job {artifact_job_id} pruned model {source_job.model_id!r}, but this probe "
            f"is for {model_id!r}; the dense model must be the one that was pruned",
            slug="artifact-model-mismatch",
            title="Artifact of another model",
            artifact_job_id=artifact_job_id,
            artifact_model=source_job.model_id,
        )
    if source_job.status is not JobStatus.succeeded:
        advice = (
            f"wait for it (GET /v1/jobs/{artifact_job_id}/wait) and submit again"
            if not source_job.status.terminal
            else "prune again and probe that job's artifact"
        )
        raise ProblemError(
            409,
            f"artifact_job_id: job {artifact_job_id} is {source_job.status}, not succeeded; {advice}",
            status_value=source_job.status.value,
            **common,
        )
    has_artifact = session.scalar(select(Artifact.id).where(Artifact.job_id == artifact_job_id).limit(1))
    if has_artifact is None:
        raise ProblemError(
            409,
            f"artifact_job_id: job {artifact_job_id} saved no pruned model (it ran with save_artifact "
            "false); prune again with save_artifact true, or give `method` and `sparsity` to prune here",
            **common,
        )


def cancel_job(services: Services, job_id: str) -> tuple[Job, bool]:
    """Cancel a job: (the job as it now is, whether it stopped at once). Queued: canceled at once,
    and whatever an earlier attempt stored is deleted. Running: asked to stop at its next safe point.
    404 for no such job, 409 when it had already finished."""
    with services.store.session() as session:
        request = lifecycle.request_cancel(session, job_id)
    outcome = request.outcome
    if outcome is lifecycle.CancelOutcome.MISSING:
        raise ProblemError(404, f"no job with id {job_id!r}", slug="job-not-found")
    with services.store.sessions() as session:
        job = get_job(session, job_id)
    if outcome is lifecycle.CancelOutcome.FINISHED:
        raise ProblemError(
            409, f"job {job_id} already {job.status}", slug="job-finished", status_value=job.status.value
        )
    if outcome is lifecycle.CancelOutcome.CANCELED:
        services.queue.remove(job_id)
        remove_job_files(services.settings, job_id, request.removed)  # what a dead attempt left
    log.info("job cancel", job_id=job_id, immediate=outcome is lifecycle.CancelOutcome.CANCELED)
    return job, outcome is lifecycle.CancelOutcome.CANCELED
