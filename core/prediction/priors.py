"""The law rung for a model with no pruned point of its own: the alpha law's slope pooled over other
models' measured curves of the method, one vote per model.

ln PPL0 / ln PPL = 1 - alpha s, so PPL = PPL0 ** (1 / (1 - alpha s)); alpha = 1 is the strict law.
alpha is fitted per curve on all its points, averaged over each model's curves, then over models;
its spread is the between-model one (Student's t on models - 1 degrees of freedom), and one model
gives no band at all: a single model says nothing about how the next one differs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from core.prediction import laws
from core.prediction.sampling import t_quantile


@dataclass(frozen=True)
class CurvePoints:
    """What a prior reads of a measured curve."""

    model: str
    label: str
    ppl0: float
    points: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class AlphaPrior:
    alpha: float
    sd: float | None  # between-model; None from one model
    models: int
    curves: int
    source: str


def curve_alpha(ppl0: float, points: Sequence[tuple[float, float]]) -> float | None:
    """The alpha law's slope fitted on a curve's pruned points; None when they cannot be fitted."""
    try:
        calibration = laws.calibrate_ppl(ppl0, points)
    except (ValueError, OverflowError, ZeroDivisionError):
        return None
    fit = next((f for f in calibration.candidates if f.law == laws.PPL_ALPHA.name), None)
    return None if fit is None else float(fit.params["alpha"])


def pooled_alpha(curves: Sequence[CurvePoints]) -> AlphaPrior | None:
    """alpha pooled model -> curve over `curves`; None when none can be fitted."""
    by_model: dict[str, list[float]] = {}
    for curve in curves:
        alpha = curve_alpha(curve.ppl0, curve.points)
        if alpha is not None:
            by_model.setdefault(curve.model, []).append(alpha)
    if not by_model:
        return None
    means = [math.fsum(values) / len(values) for values in by_model.values()]
    alpha = math.fsum(means) / len(means)
    sd = math.sqrt(math.fsum((m - alpha) ** 2 for m in means) / (len(means) - 1)) if len(means) > 1 else None
    names = ", ".join(sorted(by_model))
    used = sum(len(values) for values in by_model.values())
    return AlphaPrior(alpha, sd, len(means), used, f"alpha pooled over {len(means)} model(s): {names}")


def ppl_at(ppl0: float, alpha: float, s: float) -> float:
    """PPL0 ** (1 / (1 - alpha s)); infinity where the law diverges."""
    denominator = 1.0 - alpha * s
    if denominator <= 0.0:
        return math.inf
    try:
        return math.exp(math.log(ppl0) / denominator)
    except OverflowError:
        return math.inf


def predict(
    ppl0: float, prior: AlphaPrior, s: float, level: float
) -> tuple[float, tuple[float, float] | None]:
    """The prior's value at s and its band at `level` (None from one model): alpha's between-model
    spread carried through the law, so the band widens with s and never reaches below PPL0."""
    value = ppl_at(ppl0, prior.alpha, s)
    if prior.sd is None:
        return value, None
    spread = t_quantile(0.5 + level / 2.0, prior.models - 1) * prior.sd
    low = max(min(ppl0, value), ppl_at(ppl0, prior.alpha - spread, s))
    return value, (low, ppl_at(ppl0, prior.alpha + spread, s))
