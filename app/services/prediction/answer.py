"""What POST /v1/predictions does: one answer per metric and sparsity from the best rung that can
give it (measured > simulated > profile > law; `app.services.prediction.rungs`), with its band and
the verdict of its own record, every rung beside it; or say which job would measure a missing dense
baseline (and queue it, with `measure_missing`), and name the jobs that would make a better rung.

Synchronous arithmetic over a few indexed reads; records are computed once per state of the store.
The answer is returned serialized (`Answered`): cached answers are bytes, and the route only picks
the status (202 when a job was queued).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import structlog
from starlette.concurrency import run_in_threadpool

from app.deps import Services
from app.problems import ProblemError
from app.schemas.jobs import JobPublic
from app.schemas.predictions import MeasurementQueued, PredictionCreate, PredictionPublic
from app.services.prediction import missing_jobs
from app.services.prediction.accuracy_prior import pooled_accuracy_prior
from app.services.prediction.metric_answer import _calibration_of, _metric_prediction
from app.services.prediction.rung_choice import _answer, _better_rungs, _evidence
from app.services.prediction.series import PPL, Selector, Series, SeriesError, SeriesKey, caller_series
from app.services.prediction.store_state import StateCache, StoreState, awaited_store_state, store_state
from app.services.prediction.stored_series import load_series
from core.methods import simulated_methods
from core.model_sources import ModelSourceError, resolve_model
from core.prediction.laws import PriorSlope
from core.store import Store

log = structlog.get_logger(__name__)

ANSWER_CACHE_SIZE = 1024
"""Answers kept per process, keyed by the store's state and the request body."""

_answers = StateCache(ANSWER_CACHE_SIZE)


@dataclass(frozen=True)
class Answered:
    """A prediction's JSON body (a `PredictionPublic`), or, when `queued_job` is set, the
    `MeasurementQueued` body of the job `measure_missing` queued for a missing baseline."""

    json: bytes
    queued_job: str | None = None


async def answer_request(body: PredictionCreate, services: Services) -> Answered:
    """`create_prediction` for the route: the store's state is awaited on the event loop
    (`core.async_reads`) and a cached answer found there; only a fresh computation runs in the
    threadpool."""
    state = await awaited_store_state(services.store, services.async_reader)
    if body.measure_missing:
        return await run_in_threadpool(_respond, body, services, state)
    key = (state, body.model_dump_json())
    cached: Answered | None = _answers.peek(key)
    if cached is not None:
        return cached
    return await run_in_threadpool(_answers.get, key, lambda: _respond(body, services, state))


def create_prediction(body: PredictionCreate, services: Services) -> Answered:
    """The answer to one prediction request (see the route's description): computed once per state
    of the store and body (an answer reads nothing else), except with `measure_missing`, which may
    queue jobs."""
    state = store_state(services.store)
    if body.measure_missing:
        return _respond(body, services, state)
    key = (state, body.model_dump_json())
    return _answers.get(key, lambda: _respond(body, services, state))


def _respond(body: PredictionCreate, services: Services, state: StoreState) -> Answered:
    wanted: list[SeriesKey] = [(m.metric, m.task) for m in body.metrics]
    selector = Selector(
        dataset=body.protocol.dataset,
        seqlen=body.protocol.seqlen,
        max_windows=body.protocol.max_windows,
        dtype=body.protocol.dtype,
    )
    series = _caller_series(body)
    from_store = [key for key in wanted if key not in series]
    model = body.model
    store = services.store  # single-statement reads (Store.read): one round trip each, no session
    if from_store:
        series.update(load_series(store, model, body.method, from_store, selector))
        missing = [series[key] for key in from_store if series[key].dense is None]
        if missing:
            model, found = _retry_with_canonical_id(services, body, from_store, selector)
            series.update(found)
            missing = [series[key] for key in from_store if series[key].dense is None]
            if missing:
                return _missing_baseline(services, body, missing)
    priors = {
        key: _prior(store, body.method, s)
        for key, s in series.items()
        if s.metric != PPL and not any(p.value > (s.chance or 0.0) for p in s.pruned)
    }
    items = []
    for key in wanted:
        calibration = _calibration_of(series[key], priors.get(key))
        item = _metric_prediction(series[key], body, calibration)
        evidence = _evidence(services, state, series[key], body, calibration, [model, body.model])
        _answer(item, evidence, body)
        if item.metric == PPL:
            _better_rungs(services, item, evidence, body, {model, body.model})
        items.append(item)
    answer = PredictionPublic(model=model, method=body.method, level=body.level, metrics=items)
    return Answered(answer.model_dump_json().encode())


def _caller_series(body: PredictionCreate) -> dict[SeriesKey, Series]:
    grouped: dict[SeriesKey, list[tuple[float, float, int | None, float | None]]] = {}
    for point in body.points or []:
        grouped.setdefault((point.metric, point.task), []).append(
            (point.sparsity, point.value, point.n_options, point.chance)
        )
    out = {}
    for (metric, task), points in grouped.items():
        dataset = body.protocol.dataset if metric == PPL else str(task)
        try:
            series = caller_series(body.model, body.method, metric, task, dataset, points)
        except SeriesError as error:
            raise ProblemError(
                422, str(error), slug="invalid-points", title="Points cannot be used"
            ) from error
        if series.dense is None:
            what = metric if task is None else f"{metric} of task {task}"
            raise ProblemError(
                422,
                f"your points for {what} hold no dense value (sparsity 0): add it, or send no points "
                f"for {what} to use the store's",
                slug="invalid-points",
                title="Points cannot be used",
            )
        out[(metric, task)] = series
    return out


def _prior(store: Store, method: str, series: Series) -> PriorSlope | None:
    return pooled_accuracy_prior(store, method, series.metric, (series.model, str(series.task)))


def _retry_with_canonical_id(
    services: Services, body: PredictionCreate, keys: list[SeriesKey], selector: Selector
) -> tuple[str, dict[SeriesKey, Series]]:
    """Results are stored under the resolved model id (e.g. an absolute path): look there too."""
    try:
        canonical = resolve_model(body.model, services.settings).model_id
    except ModelSourceError:
        return body.model, {}
    if canonical == body.model:
        return body.model, {}
    return canonical, load_series(services.store, canonical, body.method, keys, selector)


# ------------------------------------------------------------------------------------ missing baseline


def _baseline_job(body: PredictionCreate, missing: list[Series]) -> tuple[dict[str, Any] | None, str | None]:
    """The one job that measures the missing baselines: a `simulate` job when only perplexity is
    missing and the method has a simulation (it measures the baseline and gives the simulated rung),
    else an `evaluate` job."""
    if all(s.metric == PPL for s in missing) and body.method in simulated_methods():
        job, why_not = missing_jobs.simulate_job(body, missing[0])
        if job is not None:
            return job, None
        log.info("no simulate job for the baseline", model=body.model, reason=why_not)
    return missing_jobs.evaluate_job(body.model, missing)


def _missing_baseline(services: Services, body: PredictionCreate, missing: list[Series]) -> Answered:
    job_body, why_not = _baseline_job(body, missing)
    model_problem = None
    model_ids = {body.model}
    try:
        model_ids.add(resolve_model(body.model, services.settings).model_id)
    except ModelSourceError as error:
        model_problem = str(error)
    active = missing_jobs.active_jobs(services, model_ids, ("evaluate", "simulate"))
    what = "; ".join(
        f"{s.metric} ({s.selection})" if s.metric == PPL else f"{s.metric} of task {s.task}" for s in missing
    )
    kind = None if job_body is None else job_body["kind"]
    if body.measure_missing and job_body is not None:
        row, reused = missing_jobs.queue(services, job_body, active)
        public = JobPublic.model_validate(row)
        queued = MeasurementQueued(
            detail=f"no dense baseline for {what}: {kind} job {row.id} measures it"
            + (" (already queued or running)" if reused else "")
            + (" and simulates the curve" if kind == "simulate" else ""),
            job=public,
            retry={
                "wait": public.links.wait,
                "then": "POST /v1/predictions with the same body",
            },
        )
        log.info("prediction waits for a baseline", model=body.model, job_id=row.id, kind=kind, reused=reused)
        return Answered(queued.model_dump_json().encode(), queued_job=row.id)
    if job_body is not None:
        fix = f"submit `job` ({kind}; POST /v1/jobs), or repeat this request with `measure_missing: true`"
        if model_problem:
            fix += f"; note that this server cannot load the model: {model_problem}"
    else:
        fix = str(why_not)
    pending = [s for s in missing if s.pruned]
    if pending:
        fix += f" ({sum(len(s.pruned) for s in pending)} pruned point(s) are stored and wait for it)"
    raise ProblemError(
        409,
        f"no measured dense baseline of {body.model!r} for {what}: {fix}",
        slug="baseline-missing",
        title="Dense baseline unknown",
        missing=[
            {"metric": s.metric, "task": s.task, "protocol": s.protocol().model_dump()} for s in missing
        ],
        job=job_body,
        active_jobs=[
            {
                "id": job.id,
                "kind": job.kind,
                "status": job.status,
                "request": job.request,
                "href": f"/v1/jobs/{job.id}",
                "supplies": job_body is not None and job.request == job_body,
            }
            for job in active
        ],
    )
