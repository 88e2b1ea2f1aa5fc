"""/v1/jobs: submit, list, inspect, cancel and wait for jobs."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import structlog
from fastapi import APIRouter, Body, Header, Query, Request, Response
from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.deps import Services, ServicesDep, SessionDep
from app.lm_eval_export import lm_eval_export
from app.model_sources import ModelSource, ModelSourceError, resolve_model
from app.pagination import keyset_page
from app.problems import Problem, ProblemError
from app.pruning import causal_lm_refusal, drop_refusal
from app.queueing import QueueUnavailable
from app.routes.results import result_public
from app.schemas import (
    DROP_METHODS,
    ArtifactList,
    ArtifactPublic,
    JobCreate,
    JobLinks,
    JobList,
    JobPublic,
    LmEvalExport,
    ProbeJobCreate,
    PruneJobCreate,
    ResultList,
    SweepJobCreate,
)
from app.tables import Artifact, Job, JobStatus, Result, utcnow
from workers.slicing.families import refusal_reason  # torch-free by design
from workers.slicing.param_count import sliced_width  # torch-free by design

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
log = structlog.get_logger(__name__)

PROBLEMS: dict[int | str, dict[str, Any]] = {
    404: {"model": Problem, "description": "No such job"},
    422: {"model": Problem, "description": "Invalid request"},
}
# Kinds whose results describe one model's accuracy: what an lm-eval results file holds.
LM_EVAL_KINDS = ("evaluate", "prune")
SUBMIT_PROBLEMS: dict[int | str, dict[str, Any]] = {
    **PROBLEMS,
    409: {"model": Problem, "description": "`artifact_job_id` names a job without a usable artifact"},
}


def job_public(job: Job) -> JobPublic:
    base = f"/v1/jobs/{job.id}"
    return JobPublic(
        id=job.id,
        kind=job.kind,
        status=job.status,  # type: ignore[arg-type]
        model=job.model_id,
        request=job.request,
        stage=job.stage,
        progress=job.progress,
        detail=job.detail,
        error=job.error,
        attempts=job.attempts,
        worker=job.worker,
        cancel_requested=job.cancel_requested,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        heartbeat_at=job.heartbeat_at,
        environment=job.environment,
        links=JobLinks(
            self=base,
            wait=f"{base}/wait",
            results=f"{base}/results",
            artifacts=f"{base}/artifacts",
            probes=f"{base}/probes",
        ),
    )


def _get_job(session: Session, job_id: str) -> Job:
    job = session.get(Job, job_id)
    if job is None:
        raise ProblemError(404, f"no job with id {job_id!r}", slug="job-not-found")
    return job


def _request_hash(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@router.post(
    "",
    status_code=202,
    response_model=JobPublic,
    responses={
        **SUBMIT_PROBLEMS,
        200: {"model": JobPublic, "description": "Replay of an idempotent submission"},
    },
)
def submit_job(
    services: ServicesDep,
    response: Response,
    job: Annotated[JobCreate, Body(discriminator="kind")],
    idempotency_key: Annotated[
        str | None,
        Header(
            max_length=255,
            description="Same key and same body return the same job; same key, different body is a 422.",
        ),
    ] = None,
) -> JobPublic:
    """Submit a job. It is stored, then queued; poll it, or block on `/wait`.

    The model is checked at once: an unknown alias, a path outside the model roots or an HF id
    missing from the local cache is a 422 here rather than a failed job later; so is a model the
    pruning method cannot handle, when its config is at hand. A `probe` job's `artifact_job_id` must
    name a succeeded `prune` job of the same model that saved its pruned model (409 otherwise).
    """
    row, replayed = create_job(services, job, idempotency_key)
    if replayed:
        response.status_code = 200
    response.headers["Location"] = f"/v1/jobs/{row.id}"
    return job_public(row)


def create_job(services: Services, job: JobCreate, idempotency_key: str | None = None) -> tuple[Job, bool]:
    """Check, store and enqueue a job: what POST /v1/jobs does (POST /v1/predictions reuses it).

    Returns the row and whether it replays an earlier submission with the same Idempotency-Key
    (the same key with a different body is a 422).
    """
    settings = services.settings
    try:
        source = resolve_model(job.model, settings, job.revision)
    except ModelSourceError as error:
        raise ProblemError(422, str(error), slug="invalid-model", title="Model not usable") from error
    if isinstance(job, PruneJobCreate):
        _check_prunable(source, job.method, [job.sparsity], job.round_to)
    elif isinstance(job, SweepJobCreate):
        _check_prunable(source, job.method, job.sparsities, job.round_to)
    elif isinstance(job, ProbeJobCreate):
        if job.method is not None and job.sparsity is not None:
            _check_prunable(source, job.method, [job.sparsity], job.round_to)
        if job.artifact_job_id is not None:
            with services.store.sessions() as session:
                _check_artifact_job(session, job.artifact_job_id, source.model_id)
    request_body = job.model_dump(mode="json")
    request_hash = _request_hash(request_body)

    with services.store.session() as session:
        if idempotency_key is not None:
            existing = session.scalar(select(Job).where(Job.idempotency_key == idempotency_key))
            if existing is not None:
                return _replay(existing, request_hash), True
        row = Job(
            kind=job.kind,
            request=request_body,
            model_id=source.model_id,
            idempotency_key=idempotency_key,
            request_hash=request_hash,
        )
        session.add(row)
        try:
            session.flush()
        except IntegrityError:
            session.rollback()
            if idempotency_key is None:
                raise  # not a concurrent replay: a real constraint violation
            existing = session.scalar(select(Job).where(Job.idempotency_key == idempotency_key))
            if existing is None:
                raise
            return _replay(existing, request_hash), True
    # The row is committed before the enqueue: a crash in between leaves a queued job that the
    # reconciler enqueues, never a queue entry without a job.
    try:
        services.queue.enqueue(row.id)
        with services.store.session() as session:
            session.execute(update(Job).where(Job.id == row.id).values(enqueued_at=utcnow()))
            row.enqueued_at = utcnow()
    except QueueUnavailable as error:
        log.warning(
            "queue unavailable at submit; the reconciler will enqueue the job",
            job_id=row.id,
            error=str(error),
        )
    log.info("job submitted", job_id=row.id, kind=row.kind, model=row.model_id)
    return row, False


def _check_prunable(source: ModelSource, method: str, sparsities: Sequence[float], round_to: int) -> None:
    """Refuse now what the worker would refuse after loading the model, when the config is at hand
    (`prune` and `probe` jobs: one sparsity; `sweep` jobs: each of theirs). SliceGPT needs a family
    it has an adapter for and a width left after slicing; the other methods a decoder-only causal
    LM, and the drop methods a layer left.

    Packaged models carry no config.json here (they are GGUF); they are known to be prunable.
    """
    config = source.config
    if config is None:
        return
    if method != "slicegpt":
        reason = causal_lm_refusal(config)
        if reason is None and method in DROP_METHODS:
            for sparsity in sparsities:
                if (reason := drop_refusal(method, sparsity, config)) is not None:
                    raise ProblemError(422, reason, slug="invalid-sparsity", title="Nothing left")
        if reason is not None:
            raise ProblemError(
                422, reason, slug="unsupported-architecture", title="Model cannot be pruned with this method"
            )
        return
    reason = refusal_reason(config)
    if reason is not None:
        raise ProblemError(
            422, reason, slug="unsupported-architecture", title="Model cannot be pruned with this method"
        )
    hidden_size = config.get("hidden_size", config.get("n_embd"))
    if isinstance(hidden_size, int):
        try:
            for sparsity in sparsities:
                sliced_width(hidden_size, sparsity, round_to)
        except ValueError as error:
            raise ProblemError(
                422, f"{error}; lower sparsity or round_to", slug="invalid-sparsity", title="Nothing left"
            ) from error


def _check_artifact_job(session: Session, artifact_job_id: str, model_id: str) -> None:
    """A probe's `artifact_job_id` must be a succeeded `prune` job of the same model with an artifact:
    422 when there is no such job or its model differs, 409 when it has (or cannot yet have) none."""
    source_job = session.get(Job, artifact_job_id)
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
            slug="artifact-unavailable",
            title="No artifact to probe",
            artifact_job_id=artifact_job_id,
            kind=source_job.kind,
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
    if source_job.status != JobStatus.succeeded.value:
        raise ProblemError(
            409,
            f"artifact_job_id: job {artifact_job_id} is {source_job.status}, not succeeded; "
            + (
                f"wait for it (GET /v1/jobs/{artifact_job_id}/wait) and submit again"
                if not JobStatus(source_job.status).terminal
                else "prune again and probe that job's artifact"
            ),
            slug="artifact-unavailable",
            title="No artifact to probe",
            artifact_job_id=artifact_job_id,
            status_value=source_job.status,
        )
    has_artifact = session.scalar(select(Artifact.id).where(Artifact.job_id == artifact_job_id).limit(1))
    if has_artifact is None:
        raise ProblemError(
            409,
            f"artifact_job_id: job {artifact_job_id} saved no pruned model (it ran with save_artifact "
            "false); prune again with save_artifact true, or give `method` and `sparsity` to prune here",
            slug="artifact-unavailable",
            title="No artifact to probe",
            artifact_job_id=artifact_job_id,
        )


def _replay(existing: Job, request_hash: str) -> Job:
    if existing.request_hash != request_hash:
        raise ProblemError(
            422,
            "this Idempotency-Key was already used with a different request body",
            slug="idempotency-key-reused",
            job_id=existing.id,
        )
    return existing


@router.get("", response_model=JobList)
def list_jobs(
    session: SessionDep,
    status: Annotated[JobStatus | None, Query(description="Only jobs in this state.")] = None,
    kind: Annotated[str | None, Query(max_length=32)] = None,
    model: Annotated[str | None, Query(max_length=512)] = None,
    cursor: Annotated[
        str | None, Query(max_length=64, description="`next_cursor` of the previous page.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> JobList:
    """Jobs, newest first, with filters and cursor pagination."""
    query = select(Job)
    if status is not None:
        query = query.where(Job.status == status.value)
    if kind is not None:
        query = query.where(Job.kind == kind)
    if model is not None:
        query = query.where(Job.model_id == model)
    page, next_cursor = keyset_page(session, query, Job.id, cursor, limit, newest_first=True)
    return JobList(items=[job_public(job) for job in page], next_cursor=next_cursor)


@router.get("/{job_id}", response_model=JobPublic, responses=PROBLEMS)
def get_job(job_id: str, session: SessionDep) -> JobPublic:
    """One job: status, stage, progress (`detail` such as 'window 7/20') and error."""
    return job_public(_get_job(session, job_id))


@router.delete(
    "/{job_id}",
    response_model=JobPublic,
    responses={
        **PROBLEMS,
        409: {"model": Problem, "description": "Job already finished"},
        202: {"model": JobPublic, "description": "Running: it stops at its next safe point"},
    },
)
def cancel_job(job_id: str, services: ServicesDep, response: Response) -> JobPublic:
    """Cancel a job. Queued: it never runs (200). Running: it stops at its next safe point (202)."""
    with services.store.session() as session:
        job = _get_job(session, job_id)
        canceled_now = session.execute(
            update(Job)
            .where(Job.id == job_id, Job.status == JobStatus.queued.value)
            .values(
                status=JobStatus.canceled.value,
                stage="canceled",
                finished_at=utcnow(),
                cancel_requested=True,
                error="canceled by request before it ran",
            )
        ).rowcount  # type: ignore[attr-defined]
        if not canceled_now:
            requested = session.execute(
                update(Job)
                .where(Job.id == job_id, Job.status == JobStatus.running.value)
                .values(cancel_requested=True)
            ).rowcount  # type: ignore[attr-defined]
            if not requested:
                session.refresh(job)
                raise ProblemError(
                    409, f"job {job_id} already {job.status}", slug="job-finished", status_value=job.status
                )
            response.status_code = 202
        session.flush()
        session.refresh(job)
    if canceled_now:
        services.queue.remove(job_id)
    log.info("job cancel", job_id=job_id, immediate=bool(canceled_now))
    return job_public(job)


@router.get("/{job_id}/wait", response_model=JobPublic, responses=PROBLEMS)
async def wait_for_job(
    job_id: str,
    services: ServicesDep,
    request: Request,
    timeout: Annotated[float, Query(gt=0, le=3600, description="Seconds to wait at most.")] = 30.0,
) -> JobPublic:
    """Block until the job reaches a terminal state or `timeout` passes; returns the job either way.

    Check `status`: anything but succeeded/failed/canceled means the timeout came first.
    The server caps the wait at PRUNECAST_MAX_WAIT_S.
    """
    deadline = time.monotonic() + min(timeout, services.settings.max_wait_s)
    delay = 0.05
    while True:
        job = await asyncio.to_thread(_load_job, services, job_id)
        if JobStatus(job.status).terminal or time.monotonic() >= deadline:
            return job_public(job)
        if await request.is_disconnected():
            return job_public(job)
        await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 1.5, 1.0)


def _load_job(services: ServicesDep, job_id: str) -> Job:
    with services.store.session() as session:
        return _get_job(session, job_id)


@router.get("/{job_id}/results", response_model=ResultList | LmEvalExport, responses=PROBLEMS)
def job_results(
    job_id: str,
    session: SessionDep,
    format: Annotated[
        Literal["json", "lm-eval"],
        Query(description="`json`: the stored results; `lm-eval`: accuracy as lm-evaluation-harness does."),
    ] = "json",
) -> ResultList | LmEvalExport:
    """Every result this job stored, or (`format=lm-eval`) its accuracy in lm-evaluation-harness's
    results format: per task `acc,none`, `acc_stderr,none`, `acc_norm,none`, ..., `alias`."""
    job = _get_job(session, job_id)
    rows = session.scalars(select(Result).where(Result.job_id == job_id).order_by(Result.id)).all()
    if format == "lm-eval":
        if job.kind not in LM_EVAL_KINDS:
            raise ProblemError(
                422,
                f"format=lm-eval exports the accuracy of one model; a {job.kind} job is not one (a sweep "
                "stores one per sparsity, a probe none): use format=json",
                slug="export-unavailable",
                title="No lm-eval export for this kind",
            )
        return LmEvalExport.model_validate(lm_eval_export(job, rows))
    return ResultList(items=[result_public(row) for row in rows])


@router.get("/{job_id}/artifacts", response_model=ArtifactList, responses=PROBLEMS)
def job_artifacts(job_id: str, session: SessionDep) -> ArtifactList:
    """What this job wrote to the artifact volume (e.g. the sliced model of a `prune` job)."""
    _get_job(session, job_id)
    rows = session.scalars(select(Artifact).where(Artifact.job_id == job_id).order_by(Artifact.id)).all()
    return ArtifactList(
        items=[
            ArtifactPublic(
                id=row.id,
                job_id=row.job_id,
                kind=row.kind,
                path=row.path,
                bytes=row.bytes,
                sha256=row.sha256,
                created_at=row.created_at,
            )
            for row in rows
        ]
    )
