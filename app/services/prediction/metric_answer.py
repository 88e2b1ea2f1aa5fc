"""One metric of an answer written as the response shows it (`MetricPredictionPublic`): the law's
prediction at each sparsity, calibrated or strict, with its flags, and the notes every prediction
would repeat said once for the metric (docs/architecture.md, "Where each rung's answer comes from,
top-down"). The rung chosen afterwards (`app.services.prediction.rung_choice`) fills in the answer.
"""

from __future__ import annotations

from app.problems import ProblemError
from app.schemas.predictions import (
    CalibrationPublic,
    MetricPredictionPublic,
    PredictedPublic,
    PredictionCreate,
)
from app.services.prediction.law_values import (
    calibrate,
    calibration_public,
    predict,
    strict_law_public,
    strict_value,
)
from app.services.prediction.series import PPL, Series, SeriesError, finite
from core.methods import stored_method_entry
from core.prediction.law_prediction import Prediction
from core.prediction.laws import Calibration, PriorSlope, predict_strict_ppl

STRICT_OFF_FLAG = 0.5
"""Relative error on measured points above which a metric carries the `strict_law_off` flag."""

STRICT_NOTE = "on the calibration points the strict law"
"""How core.prediction.laws starts its note on the strict law's errors; the response's `strict_law`
says it once."""


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
