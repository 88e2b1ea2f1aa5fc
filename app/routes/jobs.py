"""/v1/jobs: submit, list, inspect, cancel and wait for jobs; their results and artifacts."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Literal

from fastapi import APIRouter, Body, Header, Query, Request, Response
from sqlalchemy import select

from app.deps import ServicesDep, SessionDep
from app.pagination import keyset_page
from app.problems import ProblemError, problem_responses
from app.schemas.jobs import ArtifactList, ArtifactPublic, JobList, JobPublic
from app.schemas.results import LmEvalExport, ResultList, ResultPublic
from app.services import jobs
from app.views.lm_eval import LM_EVAL_KINDS, lm_eval_export
from core.specs import JobCreate
from core.tables import Artifact, Job, JobStatus

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

NOT_FOUND = problem_responses({404: "No such job"})


@router.post(
    "",
    status_code=202,
    response_model=JobPublic,
    responses={
        200: {"model": JobPublic, "description": "Replay of an idempotent submission"},
        **problem_responses({409: "`artifact_job_id` names a job without a usable artifact"}),
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
    row, replayed = jobs.create_job(services, job, idempotency_key)
    if replayed:
        response.status_code = 200
    response.headers["Location"] = f"/v1/jobs/{row.id}"
    return JobPublic.model_validate(row)


@router.get("", response_model=JobList)
def list_jobs(
    session: SessionDep,
    status: Annotated[JobStatus | None, Query(description="Only jobs in this state.")] = None,
    kind: Annotated[str | None, Query(max_length=32)] = None,
    model: Annotated[str | None, Query(max_length=512)] = None,
    parent_id: Annotated[
        str | None, Query(max_length=36, description="Only the jobs this job created (a fanned-out sweep's).")
    ] = None,
    cursor: Annotated[
        str | None, Query(max_length=64, description="`next_cursor` of the previous page.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> JobList:
    """Jobs, newest first, with filters and cursor pagination."""
    query = select(Job)
    if status is not None:
        query = query.where(Job.status == status)
    if kind is not None:
        query = query.where(Job.kind == kind)
    if model is not None:
        query = query.where(Job.model_id == model)
    if parent_id is not None:
        query = query.where(Job.parent_id == parent_id)
    page, next_cursor = keyset_page(session, query, Job.id, cursor, limit, newest_first=True)
    return JobList(items=[JobPublic.model_validate(job) for job in page], next_cursor=next_cursor)


@router.get("/{job_id}", response_model=JobPublic, responses=NOT_FOUND)
def get_job(job_id: str, session: SessionDep) -> JobPublic:
    """One job: status, stage, progress (`detail` such as 'window 7/20') and error."""
    return JobPublic.model_validate(jobs.get_job(session, job_id))


@router.delete(
    "/{job_id}",
    response_model=JobPublic,
    responses={
        202: {"model": JobPublic, "description": "Running: it stops at its next safe point"},
        **problem_responses({404: "No such job", 409: "Job already finished"}),
    },
)
def cancel_job(job_id: str, services: ServicesDep, response: Response) -> JobPublic:
    """Cancel a job. Queued: it never runs (200). Running: it stops at its next safe point (202).
    A canceled job keeps nothing it stored: no results, fits, probe points or artifacts."""
    job, immediate = jobs.cancel_job(services, job_id)
    if not immediate:
        response.status_code = 202
    return JobPublic.model_validate(job)


@router.get("/{job_id}/wait", response_model=JobPublic, responses=NOT_FOUND)
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
        if job.status.terminal or time.monotonic() >= deadline or await request.is_disconnected():
            return job
        await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 1.5, 1.0)


def _load_job(services: ServicesDep, job_id: str) -> JobPublic:
    with services.store.sessions() as session:
        return JobPublic.model_validate(jobs.get_job(session, job_id))


@router.get(
    "/{job_id}/results",
    response_model=ResultList | LmEvalExport,
    responses=problem_responses({404: "No such job", 422: "No lm-eval export for this kind of job"}),
)
def job_results(
    job_id: str,
    session: SessionDep,
    format: Annotated[
        Literal["json", "lm-eval"],
        Query(description="`json`: the stored results; `lm-eval`: accuracy as lm-evaluation-harness does."),
    ] = "json",
) -> ResultList | LmEvalExport:
    """Every result this job stored, with those of the jobs it created (a fanned-out sweep's points,
    stored by its per-sparsity children), or (`format=lm-eval`) its accuracy in lm-evaluation-harness's
    results format: per task `acc,none`, `acc_stderr,none`, `acc_norm,none`, ..., `alias` (a filtered
    metric under its filter's name: `exact_match,strict-match`)."""
    job = jobs.get_job(session, job_id)
    rows = jobs.job_results(session, job_id)
    if format == "json":
        return ResultList(items=[ResultPublic.model_validate(row) for row in rows])
    if job.kind not in LM_EVAL_KINDS:
        raise ProblemError(
            422,
            f"format=lm-eval exports the accuracy of one model; a {job.kind} job is not one (a sweep "
            "stores one per sparsity, a probe none): use format=json",
            slug="export-unavailable",
            title="No lm-eval export for this kind",
        )
    return LmEvalExport.model_validate(lm_eval_export(job, rows))


@router.get("/{job_id}/artifacts", response_model=ArtifactList, responses=NOT_FOUND)
def job_artifacts(job_id: str, session: SessionDep) -> ArtifactList:
    """What this job wrote to the artifact volume (e.g. the pruned model of a `prune` job)."""
    jobs.get_job(session, job_id)
    rows = session.scalars(select(Artifact).where(Artifact.job_id == job_id).order_by(Artifact.id)).all()
    return ArtifactList(items=[ArtifactPublic.model_validate(row) for row in rows])
