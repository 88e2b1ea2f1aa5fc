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
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from app.deps import Services
from app.problems import ProblemError
from app.schemas.jobs import JobPublic
from app.schemas.predictions import (
    CalibrationPublic,
    EstimatePublic,
    MeasurementQueued,
    MetricPredictionPublic,
    MissingJobPublic,
    PredictedPublic,
    PredictionCreate,
    PredictionPublic,
)
from app.schemas.records import verdict_public
from app.services.prediction import missing_jobs
from app.services.prediction.law_values import (
    calibrate,
    calibration_public,
    predict,
    strict_law_public,
    strict_value,
)
from app.services.prediction.profile_rung import BeforePruning, before_pruning_public, cached_before_pruning
from app.services.prediction.rungs import Evidence, estimates
from app.services.prediction.scored_curves import scored_curves
from app.services.prediction.series import (
    PPL,
    Selector,
    Series,
    SeriesError,
    SeriesKey,
    caller_series,
    finite,
    load_series,
    pooled_accuracy_prior,
)
from app.services.prediction.simulated import ProtocolKey, newest_simulation, simulation_records
from app.services.prediction.simulated_scores import newest_simulated_scores
from app.services.prediction.store_state import StateCache, StoreState, awaited_store_state, store_state
from core.methods import simulated_methods, stored_method_entry
from core.model_sources import ModelSourceError, resolve_model
from core.prediction.laws import Calibration, Prediction, PriorSlope, predict_strict_ppl
from core.prediction.rungs import Estimate, best
from core.profiles import METHOD_FEATURES
from core.store import Store

log = structlog.get_logger(__name__)

STRICT_OFF_FLAG = 0.5
"""Relative error on measured points above which a metric carries the `strict_law_off` flag."""

STRICT_NOTE = "on the calibration points the strict law"
"""How core.prediction.laws starts its note on the strict law's errors; the response's `strict_law`
says it once."""


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


def _evidence(
    services: Services,
    state: StoreState,
    series: Series,
    body: PredictionCreate,
    calibration: Calibration | None,
    model_ids: list[str],
) -> Evidence:
    """What the rungs of one metric read (`app.services.prediction.rungs.Evidence`): accuracy has the
    measured, simulated (task scores compared with the series' stored dense score) and law rungs."""
    if series.metric != PPL:
        dense_id = None if series.dense is None else series.dense.result_id
        if series.task is None or dense_id is None:
            return Evidence(series, body.level, calibration)
        with services.store.session() as session:  # it reads only where a cache misses
            task_scores = newest_simulated_scores(
                session, series.model, series.method, series.task, series.metric, dense_id, state
            )
        return Evidence(series, body.level, calibration, simulated_scores=task_scores)
    assert series.dense is not None
    if series.source == "store":
        protocol: ProtocolKey = (series.seqlen, series.max_windows, series.dtype)
    else:
        protocol = (body.protocol.seqlen, body.protocol.max_windows, body.protocol.dtype)
    method, level = series.method, body.level
    with services.store.session() as session:  # it reads only where a cache misses
        scored = scored_curves(session, method, level, state)
        records = simulation_records(session, method, level, state)
        simulation = newest_simulation(
            session,
            series.model,
            method,
            series.dataset,
            protocol,
            any_unset=series.source != "store",
            state=state,
        )
        before = None
        if method in METHOD_FEATURES:
            before = _before_pruning(session, state, model_ids, body, series)
    scores = {(score.predictor, score.mode): score for score in scored.scores}
    return Evidence(series, level, calibration, scored.curves, scores, simulation, records, before)


def _before_pruning(
    session: Session, state: StoreState, model_ids: list[str], body: PredictionCreate, series: Series
) -> BeforePruning | None:
    """The profile-based predictions (`app.services.prediction.profile_rung`), when the model has a
    stored profile, updated with the series' own pruned points. A profile the laws cannot use (say, a dense
    perplexity they refuse) leaves the rest of the answer standing: logged, and the rung says so."""
    assert series.dense is not None
    try:
        return cached_before_pruning(
            session,
            state,
            sorted(set(model_ids)),
            body.method,
            series.dense.value,
            body.sparsities,
            body.level,
            None if body.calibration is None else body.calibration.model_dump(),
            [p.as_tuple for p in series.pruned],
        )
    except ValueError as error:
        log.warning("no prediction from the profile", model=body.model, reason=str(error))
        return None


def _answer(item: MetricPredictionPublic, evidence: Evidence, body: PredictionCreate) -> None:
    """Each prediction's answer from its rungs (`core.prediction.rungs.best`), the rest beside it."""
    if evidence.before is not None:
        item.before_pruning = before_pruning_public(evidence.before)
    for predicted in item.predictions:
        found = estimates(evidence, predicted.sparsity)
        chosen = best(found, body.rung)
        predicted.alternatives = [_estimate_public(e) for e in found]
        if chosen is None:
            predicted.value, predicted.band, predicted.rung, predicted.predictor = None, None, None, None
            predicted.flags.append("no_answer")
            wanted = "no rung" if body.rung == "best" else f"the {body.rung} rung"
            predicted.notes.append(f"{wanted} can answer here: see `alternatives` for why each cannot")
        else:
            predicted.value, predicted.rung, predicted.predictor = (
                finite(chosen.value),
                str(chosen.rung),
                chosen.predictor,
            )
            predicted.band = None if chosen.band is None else [finite(b) for b in chosen.band]
            predicted.verdict = verdict_public(chosen.verdict)
            predicted.flags.extend(f for f in chosen.flags if f not in predicted.flags)
        if predicted.strict is not None and predicted.value:
            predicted.strict_vs_value = finite(predicted.strict / predicted.value - 1.0)
        else:
            predicted.strict_vs_value = None


def _estimate_public(estimate: Estimate) -> EstimatePublic:
    return EstimatePublic(
        rung=str(estimate.rung),
        value=None if estimate.value is None else finite(estimate.value),
        band=None if estimate.band is None else [finite(b) for b in estimate.band],
        predictor=estimate.predictor,
        source=estimate.source,
        verdict=verdict_public(estimate.verdict),
        why_not=estimate.why_not,
        flags=list(estimate.flags),
    )


def _better_rungs(
    services: Services,
    item: MetricPredictionPublic,
    evidence: Evidence,
    body: PredictionCreate,
    model_ids: set[str],
) -> None:
    """Name the jobs that would give a better rung (`missing`), and queue them with `measure_missing`;
    none when every asked sparsity is measured already."""
    if all(p.rung == "measured" for p in item.predictions):
        return
    jobs, why = missing_jobs.better_rungs(
        body, evidence.series, simulated=evidence.simulation is not None, profiled=evidence.before is not None
    )
    item.notes.extend(why)
    item.missing = [MissingJobPublic(kind=j.kind, gives=j.gives, job=j.body) for j in jobs]
    if not body.measure_missing or not jobs:
        return
    active = missing_jobs.active_jobs(services, _with_canonical(services, model_ids), ("simulate", "profile"))
    for job in jobs:
        row, reused = missing_jobs.queue(services, job.body, active)
        item.queued.append(JobPublic.model_validate(row))
        log.info(
            "prediction queued a better rung", model=body.model, job_id=row.id, kind=job.kind, reused=reused
        )


def _with_canonical(services: Services, model_ids: set[str]) -> set[str]:
    ids = set(model_ids)
    for model in model_ids:
        try:
            ids.add(resolve_model(model, services.settings).model_id)
        except ModelSourceError:
            continue
    return ids


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


# ------------------------------------------------------------------------------------------- answers


def _calibration_of(series: Series, prior: PriorSlope | None) -> Calibration | None:
    """The calibrated law of the series (None: no pruned point); 422 (your points) or 409 (the
    store's) when the points cannot be fitted."""
    try:
        return calibrate(series, prior)
    except SeriesError as error:
        status, source = (422, "your points") if series.source == "caller" else (409, "the stored points")
        raise ProblemError(
            status,
            f"{source} for {series.metric} cannot be fitted: {error}",
            slug="unfittable-points",
            title="Points cannot be fitted",
        ) from error


def _metric_prediction(
    series: Series, body: PredictionCreate, calibration: Calibration | None
) -> MetricPredictionPublic:
    assert series.dense is not None
    predictions = [_predicted(series, calibration, s, body.level) for s in body.sparsities]
    strict_law = strict_law_public(series)
    flags: list[str] = []
    notes = list(series.notes)
    if series.source == "caller":
        flags.append("caller_points")
    if calibration is None:
        flags.append("strict_only")
    else:
        flags.extend(calibration.flags)
    if strict_law is not None and (strict_law.max_abs_rel_error or 0.0) > STRICT_OFF_FLAG:
        flags.append("strict_law_off")
    entry = stored_method_entry(series.method)
    if series.metric == PPL and entry is not None and not entry.strict_law_applies:
        flags.append("strict_law_not_for_method")
        notes.append(
            f"the strict law is a slicing law; for {series.method} it is shown for reference only and the "
            "calibrated law (an empirical curve of this method) is the prediction"
        )
    # what every prediction of this metric would repeat (law choice, its notes) is said once, here
    shared = _shared_notes(series, calibration)
    notes.extend(
        note
        for note in dict.fromkeys(n for p in predictions for n in p.notes)
        if note in shared and not note.startswith(STRICT_NOTE)  # the verdict below says it
    )
    for p in predictions:
        p.notes = [note for note in p.notes if note not in shared]
    if strict_law is not None:
        notes.append(strict_law.verdict)
    fitted = calibration.chosen.points if calibration is not None else ()
    return MetricPredictionPublic(
        metric=series.metric,
        task=series.task,
        source=series.source,
        protocol=series.protocol(),
        baseline=series.dense.public(),
        fitted_on=[p.public() for p in series.pruned_by_sparsity if p.as_tuple in fitted],
        calibration=_calibration(calibration),
        strict_law=strict_law,
        predictions=predictions,
        flags=flags,
        notes=notes,
    )


def _shared_notes(series: Series, calibration: Calibration | None) -> set[str]:
    assert series.dense is not None
    if calibration is None:
        return set(predict_strict_ppl(series.dense.value, 0.0).notes)
    shared = {f"law chosen: {calibration.reason}", *calibration.notes, *calibration.chosen.notes}
    probe = predict(calibration, min(p.sparsity for p in series.pruned), 0.5) if series.pruned else None
    if probe is not None:
        shared.update(n for n in probe.notes if n.startswith(STRICT_NOTE))
    return shared


def _calibration(calibration: Calibration | None) -> CalibrationPublic | None:
    return calibration_public(calibration) if calibration is not None else None


def _predicted(series: Series, calibration: Calibration | None, s: float, level: float) -> PredictedPublic:
    assert series.dense is not None
    strict = strict_value(series.dense.value, s) if series.metric == PPL else None
    prediction: Prediction | None
    if calibration is not None:
        prediction = predict(calibration, s, level)
        law = calibration.chosen.law
    else:
        try:
            prediction = predict_strict_ppl(series.dense.value, s)
        except OverflowError:
            prediction = None
        law = "strict"
    if prediction is None:
        return PredictedPublic(
            sparsity=s,
            value=None,
            band=None,
            level=level,
            expected_rel_error=None,
            law=law,
            formula="",
            params={},
            strict=strict,
            flags=["non_finite", "overflow"],
            notes=["the law's value overflows a float here (it diverges as s -> 1); JSON carries null"],
        )
    value = finite(prediction.value)
    band = [finite(prediction.band[0]), finite(prediction.band[1])] if prediction.band else None
    flags = list(prediction.flags)
    notes = list(prediction.notes)
    if value is None or (band is not None and None in band):
        flags.append("non_finite")
        notes.append("null values are infinite: JSON has no infinity")
    return PredictedPublic(
        sparsity=s,
        value=value,
        band=band,
        level=level,
        expected_rel_error=finite(prediction.expected_rel_error),
        law=prediction.law,
        formula=prediction.formula,
        params={name: finite(v) for name, v in prediction.params.items()},
        strict=strict,
        strict_vs_value=finite(strict / value - 1.0) if strict is not None and value else None,
        flags=flags,
        notes=notes,
    )
