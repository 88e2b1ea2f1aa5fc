"""What POST /v1/predictions does: predict each metric at each sparsity from the laws, over the
store's measured points (or the caller's), or say which `evaluate` job would measure a missing
dense baseline (and queue it, with `measure_missing`).

Synchronous and pure arithmetic (core.laws) over at most two small indexed reads.
"""

from __future__ import annotations

from typing import Any

import structlog
from fastapi import Response
from pydantic import TypeAdapter, ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.deps import Services
from app.problems import ProblemError
from app.schemas.jobs import JobPublic
from app.schemas.predictions import (
    CalibrationPublic,
    MeasurementQueued,
    MetricPredictionPublic,
    PredictedPublic,
    PredictionCreate,
    PredictionPublic,
)
from app.schemas.profiles import BeforePruningPublic
from app.services.jobs import create_job
from app.services.profiles import before_pruning_public, predict_before_pruning
from app.services.series import (
    PPL,
    Selector,
    Series,
    SeriesError,
    SeriesKey,
    calibrate,
    calibration_public,
    caller_series,
    finite,
    load_series,
    pooled_accuracy_prior,
    predict,
    strict_law_public,
    strict_value,
)
from core.laws import Calibration, Prediction, PriorSlope, predict_strict_ppl
from core.methods import stored_method_entry
from core.model_sources import ModelSourceError, resolve_model
from core.profiles import METHOD_FEATURES
from core.specs import JobCreate
from core.store import Store
from core.tables import Job, JobStatus

log = structlog.get_logger(__name__)

STRICT_OFF_FLAG = 0.5
"""Relative error on measured points above which a metric carries the `strict_law_off` flag."""

STRICT_NOTE = "on the calibration points the strict law"
"""How core.laws starts its note on the strict law's errors; the response's `strict_law` says it once."""

_job_adapter: TypeAdapter[Any] = TypeAdapter(JobCreate)


def create_prediction(body: PredictionCreate, services: Services) -> Response:
    """The answer to one prediction request (see the route's description)."""
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
    items = [_metric_prediction(series[key], body, priors.get(key)) for key in wanted]
    for item in items:
        if item.metric == PPL and body.method in METHOD_FEATURES:
            item.before_pruning = _before_pruning(store, [model, body.model], body, item.baseline.value)
    answer = PredictionPublic(model=model, method=body.method, level=body.level, metrics=items)
    return Response(answer.model_dump_json(), media_type="application/json")


def _before_pruning(
    store: Store, model_ids: list[str], body: PredictionCreate, ppl0: float
) -> BeforePruningPublic | None:
    """The profile-based predictions (app.services.profiles), when the model has a stored profile.
    A profile the laws cannot use (say, a dense perplexity they refuse) leaves the rest of the answer
    standing: logged, and `before_pruning` is null."""
    try:
        with store.session() as session:
            answer = predict_before_pruning(
                session,
                sorted(set(model_ids)),
                body.method,
                ppl0,
                body.sparsities,
                body.level,
                None if body.calibration is None else body.calibration.model_dump(),
            )
    except ValueError as error:
        log.warning("no prediction from the profile", model=body.model, reason=str(error))
        return None
    return None if answer is None else before_pruning_public(answer)


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


def evaluate_job_body(model: str, missing: list[Series]) -> tuple[dict[str, Any] | None, str | None]:
    """The evaluate job that measures the missing dense baselines, validated like POST /v1/jobs
    validates it, or None and why not (e.g. this server's evaluate jobs cannot score a task)."""
    ppl = next((s for s in missing if s.metric == PPL), None)
    perplexity: dict[str, Any] = {"dataset": "wikitext2", "seqlen": 2048, "max_windows": None}
    if ppl is not None:
        perplexity.update(dataset=ppl.dataset, seqlen=ppl.seqlen or 2048, max_windows=ppl.max_windows)
    body: dict[str, Any] = {"kind": "evaluate", "model": model, "perplexity": perplexity}
    if ppl is not None and ppl.dtype is not None:
        body["dtype"] = ppl.dtype  # else "auto" could measure another dtype than the one asked for
    tasks = sorted({str(s.task) for s in missing if s.metric != PPL})
    if tasks:
        body["accuracy"] = {"tasks": tasks}
    try:
        job = _job_adapter.validate_python(body)
    except ValidationError:
        return None, (
            f"this server's evaluate jobs cannot measure accuracy on {', '.join(tasks)} yet: send the "
            "dense and pruned values you measured in `points`"
        )
    dumped: dict[str, Any] = job.model_dump(mode="json")
    return dumped, None


def _active_evaluate_jobs(session: Session, model_ids: set[str]) -> list[Job]:
    query = (
        select(Job)
        .where(
            Job.kind == "evaluate",
            Job.model_id.in_(model_ids),
            Job.status.in_((JobStatus.queued.value, JobStatus.running.value)),
        )
        .order_by(Job.id.desc())
        .limit(10)
    )
    return list(session.scalars(query))


def _missing_baseline(services: Services, body: PredictionCreate, missing: list[Series]) -> Response:
    job_body, why_not = evaluate_job_body(body.model, missing)
    model_problem = None
    model_ids = {body.model}
    try:
        model_ids.add(resolve_model(body.model, services.settings).model_id)
    except ModelSourceError as error:
        model_problem = str(error)
    with services.store.session() as session:
        active = _active_evaluate_jobs(session, model_ids)
    what = "; ".join(
        f"{s.metric} ({s.selection})" if s.metric == PPL else f"{s.metric} of task {s.task}" for s in missing
    )
    if body.measure_missing and job_body is not None:
        same = next((job for job in active if job.request == job_body), None)
        if same is None:
            row, _ = create_job(services, _job_adapter.validate_python(job_body))
        else:
            row = same
        public = JobPublic.model_validate(row)
        queued = MeasurementQueued(
            detail=f"no dense baseline for {what}: job {row.id} measures it"
            + (" (already queued or running)" if same is not None else ""),
            job=public,
            retry={
                "wait": public.links.wait,
                "then": "POST /v1/predictions with the same body",
            },
        )
        log.info("prediction waits for a baseline", model=body.model, job_id=row.id, reused=same is not None)
        return Response(
            queued.model_dump_json(),
            status_code=202,
            media_type="application/json",
            headers={"Location": f"/v1/jobs/{row.id}"},
        )
    if job_body is not None:
        fix = "submit `evaluate_job` (POST /v1/jobs), or repeat this request with `measure_missing: true`"
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
        evaluate_job=job_body,
        active_jobs=[
            {
                "id": job.id,
                "status": job.status,
                "request": job.request,
                "href": f"/v1/jobs/{job.id}",
                "supplies": job_body is not None and job.request == job_body,
            }
            for job in active
        ],
    )


# ------------------------------------------------------------------------------------------- answers


def _metric_prediction(
    series: Series, body: PredictionCreate, prior: PriorSlope | None
) -> MetricPredictionPublic:
    assert series.dense is not None
    try:
        calibration = calibrate(series, prior)
    except SeriesError as error:
        status, source = (422, "your points") if series.source == "caller" else (409, "the stored points")
        raise ProblemError(
            status,
            f"{source} for {series.metric} cannot be fitted: {error}",
            slug="unfittable-points",
            title="Points cannot be fitted",
        ) from error
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
