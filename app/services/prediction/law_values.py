"""The laws fitted to a series (`core.prediction.laws`): the calibrated law, the strict law for
reference and how far it is from the measured points, as values and as the API shows them.
"""

from __future__ import annotations

import math
from functools import lru_cache

from app.schemas.predictions import (
    CalibrationPublic,
    FitQualityPublic,
    StrictErrorPublic,
    StrictLawPublic,
)
from app.services.prediction.series import PPL, Series, SeriesError, finite, n_options_for
from core.prediction.law_prediction import FitQuality, Prediction
from core.prediction.laws import (
    STRICT_FORMULA,
    Calibration,
    PriorSlope,
    calibrate_acc,
    calibrate_ppl,
    strict_ppl,
)

CALIBRATION_CACHE_SIZE = 4096

"""Fitted calibrations kept per process, keyed by their points (each a few kilobytes)."""


STRICT_OFF = 0.10

"""Relative error on measured points above which the strict law is called off in the verdict."""


def calibrate(series: Series, prior: PriorSlope | None = None) -> Calibration | None:
    """The calibrated law of a series with a dense point; None for perplexity without pruned points
    (only the strict law applies). Raises SeriesError when the points cannot be fitted."""
    if series.dense is None:
        raise SeriesError(f"no dense baseline for {series.metric}")
    points = tuple(sorted(p.as_tuple for p in series.pruned))
    n_options = 0 if series.metric == PPL else n_options_for(series.chance)
    return _calibrate(series.metric, series.dense.value, points, n_options, prior)


@lru_cache(maxsize=CALIBRATION_CACHE_SIZE)
def _calibrate(
    metric: str,
    baseline: float,
    points: tuple[tuple[float, float], ...],
    n_options: int,
    prior: PriorSlope | None,
) -> Calibration | None:
    """Fits are pure functions of their inputs and Calibrations are immutable: the same points (the
    common case: a store that changes only when a job finishes) are fitted once per process."""
    try:
        if metric == PPL:
            strict_ppl(baseline, 0.0)  # checks PPL0 > 1 even when nothing is fitted
            return calibrate_ppl(baseline, points) if points else None
        return calibrate_acc(baseline, points, n_options, prior=prior)
    except (ValueError, OverflowError, ZeroDivisionError) as error:
        raise SeriesError(str(error)) from error


def strict_value(ppl0: float, sparsity: float) -> float | None:
    """The strict law, or None where it overflows a float (it diverges as s -> 1)."""
    try:
        return finite(strict_ppl(ppl0, sparsity))
    except OverflowError:
        return None


def predict(calibration: Calibration, sparsity: float, level: float) -> Prediction | None:
    """The calibrated prediction, or None where its arithmetic overflows a float."""
    try:
        return calibration.predict(sparsity, level)
    except (OverflowError, ZeroDivisionError):
        return None


def _quality(quality: FitQuality) -> FitQualityPublic:
    return FitQualityPublic(
        n=quality.n, r2=finite(quality.r2), max_ape=finite(quality.max_ape), mean_ape=finite(quality.mean_ape)
    )


def calibration_public(calibration: Calibration) -> CalibrationPublic:
    chosen = calibration.chosen
    return CalibrationPublic(
        law=chosen.law,
        formula=chosen.form.formula,
        params={name: finite(value) for name, value in chosen.params.items()},
        reason=calibration.reason,
        loo_rel_error=finite(chosen.loo_rel_error),
        sigma=finite(chosen.sigma),
        quality={law: _quality(q) for law, q in calibration.quality.items()},
    )


def strict_law_public(series: Series) -> StrictLawPublic | None:
    """How far the strict law is from the measured pruned points (perplexity with a baseline only)."""
    if series.metric != PPL or series.dense is None:
        return None
    ppl0 = series.dense.value
    errors = []
    for point in sorted(series.pruned, key=lambda p: p.sparsity):
        strict = strict_value(ppl0, point.sparsity)
        rel = None if strict is None else strict / point.value - 1.0
        errors.append(
            StrictErrorPublic(sparsity=point.sparsity, measured=point.value, strict=strict, rel_error=rel)
        )
    rels = [abs(e.rel_error) if e.rel_error is not None else math.inf for e in errors]
    worst = max(rels, default=None)
    mean = sum(rels) / len(rels) if rels else None
    if not errors:
        verdict = "no measured pruned point: the strict law cannot be checked here; it has no error estimate"
    else:
        shown = ", ".join(
            f"{e.rel_error:+.0%} at s = {e.sparsity:g}"
            if e.rel_error is not None
            else f"overflow at s = {e.sparsity:g}"
            for e in errors
        )
        if worst is not None and worst > STRICT_OFF:
            verdict = f"the strict law is off by {shown} on the measured points: use the calibrated law"
        else:
            verdict = f"the strict law matches the measured points within {STRICT_OFF:.0%} ({shown})"
    return StrictLawPublic(
        formula=STRICT_FORMULA,
        errors=errors,
        max_abs_rel_error=finite(worst),
        mean_abs_rel_error=finite(mean),
        verdict=verdict,
    )
