"""Fits of the prediction laws as rows of the store (`fits`), built from measured points.

A `sweep` job measures a model at several sparsities and stores here what `core.prediction.laws` made of the
points: the chosen law and its parameters, why it was chosen, and how well every candidate law
(the strict law included) matched the points, so the store accumulates calibration for every model
it has seen. Pure Python like `core.prediction.laws` (no torch), so the API side can build fits too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from core.prediction import law_prediction, laws
from core.tables import Fit

EMPIRICAL_PREFIX = "empirical-"
"""How the fit of a method without a law of its own is named: `empirical-alpha`, `empirical-affine`."""


class FitError(ValueError):
    """The points cannot be fitted; the message says which points and why."""


@dataclass(frozen=True)
class MeasuredPoint:
    """A measured value at a sparsity (0 = the dense model) and the result row it came from."""

    sparsity: float
    value: float
    result_id: int | None = None


def usable_ppl(value: float) -> bool:
    """A perplexity the laws can use: finite and > 1 (a collapsed model can score inf)."""
    return math.isfinite(value) and value > 1.0


def ppl_fit(
    *,
    model_id: str,
    model_revision: str | None,
    method: str,
    dataset: str,
    protocol: dict[str, Any],
    dense: MeasuredPoint,
    points: Sequence[MeasuredPoint],
    job_id: str | None = None,
    strict_law: bool = True,
) -> Fit:
    """Fit the calibrated perplexity laws (`laws.calibrate_ppl`) to the pruned `points` anchored at
    `dense`, and describe the outcome as a `fits` row (not yet added to a session).

    Points whose perplexity is not finite or not above 1 are kept in the row with `used: false` and
    left out of the fit; at least one usable pruned point is needed. Raises FitError otherwise.
    Without `strict_law` (methods other than slicing) the row is an empirical curve: its law is
    named `empirical-<law>` and the strict law is left out of its quality.
    """
    if dense.sparsity != 0.0:
        raise FitError(f"the dense point must be at sparsity 0, got {dense.sparsity}")
    if not usable_ppl(dense.value):
        raise FitError(f"dense perplexity {dense.value} is not a finite number > 1: nothing to anchor on")
    pruned = sorted((p for p in points if p.sparsity > 0.0), key=lambda p: p.sparsity)
    usable = [p for p in pruned if usable_ppl(p.value)]
    if not usable:
        raise FitError(
            f"no pruned point with a finite perplexity > 1 to fit (measured: "
            f"{', '.join(f's={p.sparsity:g}: {p.value:g}' for p in pruned) or 'none'})"
        )
    try:
        calibration = laws.calibrate_ppl(dense.value, [(p.sparsity, p.value) for p in usable])
    except (ValueError, OverflowError, ZeroDivisionError) as error:
        raise FitError(str(error)) from error
    quality = quality_record(calibration, strict_params={"ppl0": dense.value})
    law, reason = calibration.chosen.law, calibration.reason
    if not strict_law:
        quality.pop("strict", None)
        law = f"{EMPIRICAL_PREFIX}{law}"
        reason = f"an empirical curve of {method} (the strict law is a slicing law); {reason}"
    return Fit(
        job_id=job_id,
        model_id=model_id,
        model_revision=model_revision,
        method=method,
        metric="ppl",
        dataset=dataset,
        protocol=protocol,
        law=law,
        formula=calibration.chosen.form.formula,
        params=_clean(calibration.chosen.params),
        baseline=dense.value,
        points=[_point(dense, True), *(_point(p, usable_ppl(p.value)) for p in pruned)],
        quality=quality,
        chosen_reason=reason,
    )


def usable_acc(value: float) -> bool:
    """An accuracy the laws can take at all: a finite fraction in (0, 1]."""
    return math.isfinite(value) and 0.0 < value <= 1.0


def n_options_from(protocol: dict[str, Any]) -> int:
    """The options per question an accuracy result was scored with, from its protocol: `n_options`
    when recorded, else the chance level (the mean of 1/options over the docs) rounded."""
    options = protocol.get("n_options")
    if isinstance(options, int) and not isinstance(options, bool) and options >= 2:
        return options
    chance = protocol.get("chance")
    if isinstance(chance, (int, float)) and not isinstance(chance, bool) and 0.0 < chance < 1.0:
        return max(2, round(1.0 / chance))
    raise FitError(f"the dense result's protocol records neither n_options nor a chance level: {protocol}")


def accuracy_fit(
    *,
    model_id: str,
    model_revision: str | None,
    method: str,
    metric: str,
    task: str,
    n_options: int,
    protocol: dict[str, Any],
    dense: MeasuredPoint,
    points: Sequence[MeasuredPoint],
    job_id: str | None = None,
) -> Fit:
    """Fit the calibrated accuracy laws (`laws.calibrate_acc`, chance = 1 / `n_options`) of one task
    and metric (`acc` or `acc_norm`) to the pruned `points` anchored at `dense`, and describe the
    outcome as a `fits` row (not yet added to a session); `dataset` is the task.

    Points that are not a fraction in (0, 1], or at or below chance (censored by the law), are kept
    in the row with `used: false`; with none left, the law falls back to its prior slope (law
    "prior", quality n = 0). Raises FitError when the dense accuracy is not in (0, 1] or the laws
    refuse the points.
    """
    if dense.sparsity != 0.0:
        raise FitError(f"the dense point must be at sparsity 0, got {dense.sparsity}")
    if not usable_acc(dense.value):
        raise FitError(
            f"dense {metric} {dense.value} on {task} is not a fraction in (0, 1]: nothing to anchor on"
        )
    chance = 1.0 / n_options if n_options >= 2 else 0.0
    pruned = sorted((p for p in points if p.sparsity > 0.0), key=lambda p: p.sparsity)
    valid = [p for p in pruned if usable_acc(p.value)]
    try:
        calibration = laws.calibrate_acc(dense.value, [(p.sparsity, p.value) for p in valid], n_options)
    except (ValueError, OverflowError, ZeroDivisionError) as error:
        raise FitError(f"{metric} on {task}: {error}") from error
    return Fit(
        job_id=job_id,
        model_id=model_id,
        model_revision=model_revision,
        method=method,
        metric=metric,
        dataset=task,
        protocol={**protocol, "n_options": n_options},
        law=calibration.chosen.law,
        formula=calibration.chosen.form.formula,
        params=_clean(calibration.chosen.params),
        baseline=dense.value,
        points=[_point(dense, True), *(_point(p, usable_acc(p.value) and p.value > chance) for p in pruned)],
        quality=quality_record(calibration),
        chosen_reason="; ".join([calibration.reason, *calibration.notes]),
    )


def quality_record(
    calibration: laws.Calibration, *, strict_params: dict[str, float] | None = None
) -> dict[str, dict[str, Any]]:
    """Per law: how it matched the calibration points (n, R², max and mean absolute percentage
    error as fractions, leave-one-out RMS relative error when defined), its formula and parameters,
    and sigma, the relative error of one measurement about it (None for the strict law)."""
    record: dict[str, dict[str, Any]] = {}
    for fit in calibration.candidates:
        record[fit.law] = {
            **_quality(calibration.quality.get(fit.law)),
            "loo_rel_error": _finite(fit.loo_rel_error),
            "formula": fit.form.formula,
            "params": _clean(fit.params),
            "sigma": _finite(fit.sigma),
            "band_from_prior": fit.band_from_prior,
        }
    if "strict" in calibration.quality:
        record["strict"] = {
            **_quality(calibration.quality["strict"]),
            "loo_rel_error": None,
            "formula": laws.STRICT_FORMULA,
            "params": _clean(strict_params or {}),
            "sigma": None,
            "band_from_prior": None,
        }
    return record


def _quality(quality: law_prediction.FitQuality | None) -> dict[str, Any]:
    if quality is None:
        return {"n": 0, "r2": None, "max_ape": None, "mean_ape": None}
    return {
        "n": quality.n,
        "r2": _finite(quality.r2),
        "max_ape": _finite(quality.max_ape),
        "mean_ape": _finite(quality.mean_ape),
    }


def _point(point: MeasuredPoint, used: bool) -> dict[str, Any]:
    return {
        "sparsity": point.sparsity,
        "value": _finite(point.value),
        "result_id": point.result_id,
        "used": used,
    }


def _finite(value: float | None) -> float | None:
    """JSON has no inf or NaN (Postgres refuses them): such values are stored as null."""
    return value if value is not None and math.isfinite(value) else None


def _clean(params: dict[str, float]) -> dict[str, float | None]:
    return {name: _finite(value) for name, value in params.items()}
