"""The accuracy prior pooled over the store (`pooled_accuracy_prior`): the slope k of every other
model and task measured with the method, for an accuracy series with no pruned point of its own
(docs/science.md §2). Apart from `stored_series` because it reads across models, not one series.
"""

from __future__ import annotations

from sqlalchemy import select

from app.services.prediction.series import Measured, n_options_for
from app.services.prediction.stored_series import _chance
from core.methods import DENSE
from core.prediction.laws import PriorSlope, calibrate_acc, pool_slopes
from core.store import Store
from core.tables import Result

MAX_PRIOR_ROWS = 20_000

"""Newest results read to pool an accuracy prior over other models and tasks."""


def pooled_accuracy_prior(
    store: Store, method: str, metric: str, exclude: tuple[str, str]
) -> PriorSlope | None:
    """The accuracy slope k pooled over every other (model, task) with a dense and a pruned point of
    this method and metric in the store; None when there is none (the law's default prior then)."""
    query = (
        select(
            Result.id,
            Result.model_id,
            Result.dataset,
            Result.method,
            Result.sparsity,
            Result.value,
            Result.protocol["chance"].as_string().label("chance"),
            Result.protocol["n_options"].as_string().label("n_options"),
        )
        .where(Result.metric == metric, Result.method.in_((DENSE, method)), Result.source == "measured")
        .order_by(Result.id.desc())
        .limit(MAX_PRIOR_ROWS)
    )
    groups: dict[tuple[str, str], tuple[list[Measured], dict[float, Measured], list[float]]] = {}
    for row in store.read(query):
        if (row.model_id, row.dataset) == exclude:
            continue
        dense, pruned, chances = groups.setdefault((row.model_id, row.dataset), ([], {}, []))
        point = Measured(float(row.sparsity), float(row.value), int(row.id))
        if row.method == DENSE:
            dense.append(point)
        elif point.sparsity > 0.0:
            pruned.setdefault(round(point.sparsity, 6), point)
        chance = _chance(row.chance, row.n_options)
        if chance is not None:
            chances.append(chance)
    slopes: list[float] = []
    names: list[str] = []
    for (model, task), (dense, pruned, chances) in sorted(groups.items()):
        slope = _fitted_slope(dense, pruned, chances)
        if slope is not None:
            slopes.append(slope)
            names.append(f"{model}/{task}")
    if not slopes:
        return None
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return pool_slopes(slopes, f"{metric} after {method} in this store ({shown})")


def _fitted_slope(dense: list[Measured], pruned: dict[float, Measured], chances: list[float]) -> float | None:
    """The accuracy slope k one model and task's own points give, or None (no pruned point, unfittable,
    or only the default prior)."""
    if not dense or not pruned:
        return None
    try:
        calibration = calibrate_acc(
            dense[0].value,
            [(p.sparsity, p.value) for p in pruned.values()],
            n_options_for(chances[0] if chances else None),
        )
    except (ValueError, OverflowError, ZeroDivisionError):
        return None
    if "prior" in calibration.flags:
        return None
    return float(calibration.candidates[0].params["k"])
