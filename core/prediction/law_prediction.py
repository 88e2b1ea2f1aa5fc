"""What every prediction law answers and accepts: a `Prediction` at one sparsity, the `FitQuality` of
a law against measured values, and the checks on the sparsities, perplexities and accuracies a law is
given (docs/science.md §2).

Its own module because the strict law, the fitted laws (`core.prediction.law_fitting`) and their
calibration (`core.prediction.laws`) all speak these types; pure standard library, like them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal

Point = tuple[float, float]
"""(sparsity, measured value): perplexity (> 1) or accuracy (in (0, 1])."""

Metric = Literal["ppl", "acc"]

DEFAULT_LEVEL = 0.95
"""Coverage of the band around each prediction (normal approximation, no t quantiles)."""


@dataclass(frozen=True)
class FitQuality:
    """How well a law's values match measured ones: R² (None when undefined) and relative errors."""

    n: int
    r2: float | None
    max_ape: float
    mean_ape: float


@dataclass(frozen=True)
class Prediction:
    """A predicted value at one sparsity, with everything a response needs to be honest about it."""

    metric: Metric
    sparsity: float
    value: float
    baseline: float
    """The measured dense value (PPL0 or acc0) the law starts from."""
    band: tuple[float, float] | None
    """(lo, hi) at ``level``; None when the law has no error model (the strict law)."""
    level: float
    expected_rel_error: float | None
    """One standard deviation of the relative error of this prediction (grows with extrapolation)."""
    law: str
    formula: str
    params: dict[str, float]
    fitted_on: tuple[Point, ...]
    flags: tuple[str, ...] = ()
    """Machine-readable: extrapolated, below_measured, band_from_prior, prior, clipped_at_chance, ..."""
    notes: tuple[str, ...] = ()
    strict_law_errors: tuple[Point, ...] = ()
    """(s, relative error of the strict law) on each calibration point, for PPL calibrations."""


# ---------------------------------------------------------------------------------------- validation


def _check_sparsity(s: float, what: str = "sparsity") -> float:
    s = float(s)
    if not math.isfinite(s) or not 0.0 <= s < 1.0:
        raise ValueError(f"{what} must be in [0, 1) (fraction removed; 1 would remove everything), got {s}")
    return s


def _check_ppl(ppl: float, what: str = "perplexity") -> float:
    ppl = float(ppl)
    if not math.isfinite(ppl) or ppl <= 1.0:
        raise ValueError(f"{what} must be a finite number > 1 (exp of a mean NLL > 0), got {ppl}")
    return ppl


def _check_acc(acc: float, what: str = "accuracy") -> float:
    acc = float(acc)
    if not math.isfinite(acc) or not 0.0 < acc <= 1.0:
        raise ValueError(f"{what} must be a fraction in (0, 1] (not a percentage), got {acc}")
    return acc


def _check_points(points: Sequence[Sequence[float]], check: Callable[[float, str], float]) -> list[Point]:
    if len(points) == 0:
        raise ValueError("no measured pruned points: pass at least one (sparsity, value) pair")
    out: list[Point] = []
    for i, point in enumerate(points):
        if len(point) != 2:
            raise ValueError(f"point {i} has {len(point)} entries; expected (sparsity, value)")
        s = _check_sparsity(point[0], f"sparsity of point {i}")
        if s == 0.0:
            raise ValueError(f"point {i} is at s = 0, the dense model: pass it as the dense baseline")
        out.append((s, check(point[1], f"value of point {i}")))
    return out


def _z(level: float) -> float:
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), e.g. 0.95, got {level}")
    return NormalDist().inv_cdf(0.5 + level / 2.0)


# ------------------------------------------------------------------------------------------ values


def _exp_or_inf(exponent: float) -> float:
    """exp() that answers inf past float range: a diverging law is a flagged value, not a crash."""
    return math.exp(exponent) if exponent < 709.0 else math.inf


def fit_quality(measured: Sequence[float], predicted: Sequence[float]) -> FitQuality:
    """R² and absolute percentage errors of ``predicted`` against ``measured`` (same order)."""
    if len(measured) != len(predicted):
        raise ValueError(f"mismatched lengths: {len(measured)} measured vs {len(predicted)} predicted values")
    if len(measured) == 0:
        raise ValueError("no points to assess: pass at least one measured value")
    y = [float(v) for v in measured]
    f = [float(v) for v in predicted]
    if not all(math.isfinite(v) and v != 0.0 for v in y):
        raise ValueError("measured values must be finite and non-zero (percentage errors divide by them)")
    ape = [abs(fi - yi) / abs(yi) for yi, fi in zip(y, f, strict=True)]
    mean = sum(y) / len(y)
    ss_tot = sum((yi - mean) ** 2 for yi in y)
    ss_res = sum((fi - yi) ** 2 for yi, fi in zip(y, f, strict=True))
    r2 = None if len(y) < 2 or ss_tot == 0.0 else 1.0 - ss_res / ss_tot
    return FitQuality(n=len(y), r2=r2, max_ape=max(ape), mean_ape=sum(ape) / len(ape))
