"""Curves of one model: measured points and both laws over a sparsity grid (GET /v1/models/.../curves,
and the job report's curve sections)."""

from __future__ import annotations

from typing import Any, Literal, cast

from app.deps import Services
from app.problems import ProblemError
from app.schemas.predictions import (
    AnswerPointPublic,
    CurvePointPublic,
    CurvePublic,
    PredictionCreate,
    PredictionPublic,
    ProtocolSelector,
)
from app.services.prediction.accuracy_prior import pooled_accuracy_prior
from app.services.prediction.answer import create_prediction
from app.services.prediction.law_values import calibrate, calibration_public, strict_value
from app.services.prediction.profile_rung import predict_before_pruning
from app.services.prediction.series import PPL, Selector, Series, SeriesError, finite
from app.services.prediction.simulated import newest_simulation
from app.services.prediction.stored_series import load_series
from app.services.profiles import newest_profiles
from core.prediction.law_prediction import DEFAULT_LEVEL, Prediction
from core.prediction.laws import Calibration
from core.profiles import METHOD_FEATURES

CURVE_GRID = tuple(round(i * 0.025, 3) for i in range(37))

"""Sparsities a curve is drawn at: 0 to 0.9."""


def _law_at(calibration: Calibration, sparsity: float, level: float) -> Prediction | None:
    """The calibrated law as an answer gives it (`Calibration.predict`): the dense value at s = 0 and,
    short of an affine perplexity law's first fitted point, ln PPL interpolated from it."""
    try:
        return calibration.predict(sparsity, level)
    except (OverflowError, ZeroDivisionError):
        return None


def _calibrated_curve(calibration: Calibration, level: float, flags: set[str]) -> list[CurvePointPublic]:
    """The calibrated law with its band on CURVE_GRID; what it meets is added to `flags`. It passes
    through the dense baseline it was fitted with; an accuracy law not anchored there (its intercept
    free) is drawn from its first fitted point on instead, never through a dense value it contradicts."""
    start = 0.0 if calibration.answers_from_dense else min(p[0] for p in calibration.chosen.points)
    if start > 0.0:
        flags.add("drawn_from_first_point")
    calibrated = []
    for s in CURVE_GRID:
        if s < start - 1e-12:
            calibrated.append(CurvePointPublic(sparsity=s, value=None))
            continue
        p = _law_at(calibration, s, level)
        low, high = p.band if p is not None and p.band else (None, None)
        point = CurvePointPublic(
            sparsity=s, value=finite(p.value) if p else None, low=finite(low), high=finite(high)
        )
        if None in (point.value, point.low, point.high):
            flags.add("non_finite")
        if p is not None:
            kept = ("prior", "clipped_at_chance", "diverged", "interpolated_from_dense")
            flags.update(f for f in p.flags if f in kept)
        calibrated.append(point)
    return calibrated


def build_curve(series: Series, calibration: Calibration | None, level: float) -> CurvePublic:
    """Measured points, the strict law (perplexity) and the calibrated law with band on CURVE_GRID."""
    if series.dense is None:
        raise SeriesError(f"no dense baseline for {series.metric}")
    flags: set[str] = set()
    strict = None
    if series.metric == PPL:
        strict = [CurvePointPublic(sparsity=s, value=strict_value(series.dense.value, s)) for s in CURVE_GRID]
    calibrated = None if calibration is None else _calibrated_curve(calibration, level, flags)
    notes = list(series.notes)
    if "non_finite" in flags:
        notes.append("null values: the law has no finite value (or band edge) there; JSON has no infinity")
    if calibration is None:
        notes.append("no measured pruned point: only the strict law is drawn")
    if "drawn_from_first_point" in flags:
        notes.append(
            "the calibrated law is not anchored at the dense point (its intercept is free), so it is "
            "drawn from its smallest fitted sparsity on, never through a dense value it contradicts"
        )
    if "interpolated_from_dense" in flags:
        notes.append(
            "the calibrated law is not anchored at the dense point (its intercept is free): short of its "
            "smallest fitted sparsity it is drawn, and answers, ln PPL interpolated from the dense value"
        )
    return CurvePublic(
        model=series.model,
        method=series.method,
        metric=series.metric,
        task=series.task,
        protocol=series.protocol(),
        level=level,
        measured=series.measured(),
        strict=strict,
        calibrated=calibrated,
        calibration=calibration_public(calibration) if calibration else None,
        flags=sorted(flags),
        notes=notes,
    )


def load_curve(
    services: Services,
    model: str,
    method: str,
    metric: str,
    task: str | None,
    selector: Selector,
    level: float = DEFAULT_LEVEL,
) -> CurvePublic:
    """The curve of one model, method, metric (and task) and protocol; 404 without a dense baseline,
    409 when the stored points cannot be fitted."""
    if (metric == PPL) == (task is not None):
        raise ProblemError(
            422,
            "`task` names the multiple-choice task of `acc` / `acc_norm` and is not taken by `ppl`",
            slug="validation-error",
        )
    key = (metric, task)
    series = load_series(services.store, model, method, [key], selector)[key]
    if series.dense is None:
        what = f"{metric} ({series.selection})" if metric == PPL else f"{metric} of task {task}"
        raise ProblemError(
            404,
            f"no measured dense baseline of {model!r} for {what}: measure one (POST /v1/jobs with an "
            "`evaluate` job; POST /v1/predictions names it) before drawing its curve",
            slug="baseline-missing",
            title="No curve",
        )
    prior = None
    if metric != PPL and not any(p.value > (series.chance or 0.0) for p in series.pruned):
        prior = pooled_accuracy_prior(services.store, method, metric, (series.model, str(task)))
    try:
        curve = build_curve(series, calibrate(series, prior), level)
    except SeriesError as error:
        raise ProblemError(
            409, f"the stored points cannot be fitted: {error}", slug="unfittable-points"
        ) from error
    curve.source = selector.source
    if metric == PPL and method in METHOD_FEATURES and selector.source == "measured":
        curve.profile_predictor, curve.profile_predicted = _profile_curve(services, series, level)
    if metric == PPL and selector.source == "measured":
        protocol = (series.seqlen, series.max_windows, series.dtype)
        with services.store.session() as session:
            simulated = newest_simulation(session, series.model, method, series.dataset, protocol)
        if simulated is not None:
            curve.simulation_job_id = simulated.job_id
            curve.simulated, curve.anchored = simulated.face, simulated.anchored
            curve.notes.append(simulated.describe)
        curve.answer = _answer_curve(services, series, level)
    return curve


def _answer_curve(services: Services, series: Series, level: float) -> list[AnswerPointPublic] | None:
    """What a prediction answers on the curve grid (every rung, the best first), so that the drawn
    curve shows the number a user is told; None where the prediction has no answer to give."""
    body = PredictionCreate(
        model=series.model,
        method=series.method,
        protocol=ProtocolSelector(
            dataset="wikitext2",
            seqlen=series.seqlen,
            max_windows="all" if series.max_windows is None else series.max_windows,  # None: the whole split
            dtype=cast(Any, series.dtype),
        ),
        sparsities=[s for s in CURVE_GRID if s > 0.0],
        level=level,
    )
    try:
        answered = create_prediction(body, services)
    except ProblemError:
        return None
    if answered.queued_job is not None:
        return None
    [metric] = PredictionPublic.model_validate_json(answered.json).metrics
    return [
        AnswerPointPublic(
            sparsity=p.sparsity,
            value=p.value,
            low=None if p.band is None else p.band[0],
            high=None if p.band is None else p.band[1],
            rung=p.rung,
        )
        for p in metric.predictions
        if p.value is not None
    ]


def _profile_curve(
    services: Services, series: Series, level: float
) -> tuple[str | None, list[CurvePointPublic] | None]:
    """The chosen feature law of the model's newest profile on the curve grid, up to the profile's
    largest sparsity (its lens readings end there)."""
    assert series.dense is not None
    with services.store.session() as session:
        profiles = newest_profiles(session, [series.model])
        if not profiles:
            return None, None
        top = max(max(p.row.sparsities) for p in profiles.values())
        grid = [s for s in CURVE_GRID if s <= top + 1e-9]
        answer = predict_before_pruning(
            session, [series.model], series.method, series.dense.value, grid, level
        )
    chosen = None if answer is None else answer.chosen_answer
    if chosen is None:
        return None, None
    points = [
        CurvePointPublic(
            sparsity=v.sparsity,
            value=finite(v.prediction.value),
            low=finite(max(v.prediction.band[0], series.dense.value)),
            high=finite(v.prediction.band[1]),
        )
        for v in chosen.values
        if v.prediction is not None
    ]
    return chosen.predictor, points


def selector_from(
    dataset: str,
    seqlen: int | None,
    max_windows: str | None,
    dtype: str | None,
    source: Literal["measured", "published"] = "measured",
) -> Selector:
    windows: int | Literal["all"] | None
    windows = None if max_windows is None else "all" if max_windows == "all" else int(max_windows)
    return Selector(dataset=dataset, seqlen=seqlen, max_windows=windows, dtype=dtype, source=source)
