"""The jobs a prediction names when what would make it better is not in the store: the dense baseline
(an `evaluate` job, or a `simulate` job, which measures it too), the simulated rung (`simulate`) and the
profile rung (`profile`). Each body is validated as POST /v1/jobs validates it; queuing one reuses an
identical job that is already queued or running.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError
from sqlalchemy import select

from app.deps import Services
from app.schemas.predictions import PredictionCreate
from app.services.jobs import create_job
from app.services.prediction.series import PPL, Series
from core.methods import simulated_methods
from core.profiles import METHOD_FEATURES
from core.specs import JobCreate
from core.specs.profile import MAX_PROFILE_SPARSITIES
from core.specs.simulate import MAX_SIMULATED_SPARSITIES
from core.tables import Job, JobStatus

_job_adapter: TypeAdapter[Any] = TypeAdapter(JobCreate)
ACTIVE_LOOKUP = 20
"""Queued or running jobs of the model looked through for one identical to a job to queue."""


@dataclass(frozen=True)
class MissingJob:
    kind: str
    gives: str
    body: dict[str, Any]


def validated(body: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """The body as POST /v1/jobs would store it, or None and why it would be refused."""
    try:
        job = _job_adapter.validate_python(body)
    except ValidationError as error:
        reasons = "; ".join(str(e["msg"]) for e in error.errors())
        return None, reasons
    dumped: dict[str, Any] = job.model_dump(mode="json")
    return dumped, None


def _perplexity(series: Series | None, body: PredictionCreate) -> dict[str, Any]:
    perplexity: dict[str, Any] = {"dataset": body.protocol.dataset, "seqlen": 2048, "max_windows": None}
    if series is not None and series.source == "store":
        perplexity.update(
            dataset=series.dataset, seqlen=series.seqlen or 2048, max_windows=series.max_windows
        )
    else:
        selector = body.protocol
        perplexity.update(
            seqlen=selector.seqlen or 2048,
            max_windows=selector.max_windows if isinstance(selector.max_windows, int) else None,
        )
    return perplexity


def _common(body: PredictionCreate, series: Series | None) -> dict[str, Any]:
    common: dict[str, Any] = {"model": body.model}
    dtype = (series.dtype if series is not None else None) or body.protocol.dtype
    if dtype is not None:
        common["dtype"] = dtype  # else "auto" could measure another dtype than the one asked for
    if body.calibration is not None:
        common["calibration"] = body.calibration.model_dump(exclude_none=True)
    return common


def _grid(sparsities: list[float], most: int) -> list[float]:
    """The asked pruned sparsities, at most `most` of them (evenly thinned, the largest kept)."""
    pruned = sorted({s for s in sparsities if s > 0.0})
    if len(pruned) <= most:
        return pruned
    step = (len(pruned) - 1) / (most - 1)
    return sorted({pruned[round(i * step)] for i in range(most)})


def simulate_job(body: PredictionCreate, series: Series | None) -> tuple[dict[str, Any] | None, str | None]:
    """The `simulate` job of the asked method, protocol and sparsities."""
    grid = _grid(list(body.sparsities), MAX_SIMULATED_SPARSITIES) or [0.1, 0.2, 0.3, 0.4, 0.5]
    request = {
        "kind": "simulate",
        **_common(body, series),
        "method": body.method,
        "sparsities": grid,
        "perplexity": _perplexity(series, body) | {"precision": body.precision},
    }
    return validated(request)


def profile_job(body: PredictionCreate, series: Series | None) -> tuple[dict[str, Any] | None, str | None]:
    """The `profile` job whose lens readings cover the asked sparsities."""
    grid = _grid(list(body.sparsities), MAX_PROFILE_SPARSITIES) or [0.1, 0.2, 0.3, 0.4, 0.5]
    return validated({"kind": "profile", **_common(body, series), "sparsities": grid})


def evaluate_job(model: str, missing: list[Series]) -> tuple[dict[str, Any] | None, str | None]:
    """The evaluate job that measures the missing dense baselines, or None and why not (e.g. this
    server's evaluate jobs cannot score a task)."""
    ppl = next((s for s in missing if s.metric == PPL), None)
    perplexity: dict[str, Any] = {"dataset": "wikitext2", "seqlen": 2048, "max_windows": None}
    if ppl is not None:
        perplexity.update(dataset=ppl.dataset, seqlen=ppl.seqlen or 2048, max_windows=ppl.max_windows)
    body: dict[str, Any] = {"kind": "evaluate", "model": model, "perplexity": perplexity}
    if ppl is not None and ppl.dtype is not None:
        body["dtype"] = ppl.dtype
    tasks = sorted({str(s.task) for s in missing if s.metric != PPL})
    if tasks:
        body["accuracy"] = {"tasks": tasks}
    job, why_not = validated(body)
    if job is None and not tasks:
        return None, why_not
    if job is None:
        return None, (
            f"this server's evaluate jobs cannot measure accuracy on {', '.join(tasks)} yet: send the "
            "dense and pruned values you measured in `points`"
        )
    return job, None


def better_rungs(
    body: PredictionCreate, series: Series, *, simulated: bool, profiled: bool
) -> tuple[list[MissingJob], list[str]]:
    """The jobs that would give this perplexity series a better rung than it has: a simulation for a
    method that has one, else a profile for a method a profile predicts; and why a job that would
    help cannot be named."""
    jobs: list[MissingJob] = []
    why: list[str] = []
    if body.method in simulated_methods():
        if not simulated:
            job, reason = simulate_job(body, series)
            if job is not None:
                jobs.append(
                    MissingJob(
                        "simulate",
                        "the simulated rung: the method's curve from passes over the dense model",
                        job,
                    )
                )
            else:
                why.append(f"a simulate job would be refused: {reason}")
    elif body.method in METHOD_FEATURES and not profiled:
        job, reason = profile_job(body, series)
        if job is not None:
            jobs.append(
                MissingJob("profile", "the profile rung: feature laws on the model's dense profile", job)
            )
        else:
            why.append(f"a profile job would be refused: {reason}")
    return jobs, why


def active_jobs(services: Services, model_ids: set[str], kinds: tuple[str, ...]) -> list[Job]:
    """The newest queued or running jobs of these kinds on these models."""
    query = (
        select(Job)
        .where(
            Job.kind.in_(kinds),
            Job.model_id.in_(model_ids),
            Job.status.in_((JobStatus.queued.value, JobStatus.running.value)),
        )
        .order_by(Job.id.desc())
        .limit(ACTIVE_LOOKUP)
    )
    with services.store.session() as session:
        return list(session.scalars(query))


def queue(services: Services, body: dict[str, Any], active: list[Job]) -> tuple[Job, bool]:
    """Queue `body`, or return the identical job already queued or running; (row, reused)."""
    same = next((job for job in active if job.request == body), None)
    if same is not None:
        return same, True
    row, _ = create_job(services, _job_adapter.validate_python(body))
    return row, False
