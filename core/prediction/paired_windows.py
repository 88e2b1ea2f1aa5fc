"""ln PPL over every window of a protocol from a few of them, paired with the dense model's windows.

A pruned model's per-window NLL follows its dense model's closely (on SmolLM2-135M the correlation was
0.90-0.98 across magnitude and slicing-like damage), and the dense model's NLL on every window is
stored once per model and protocol with its baseline. So the dense windows are a control variate:
score the pruned (or simulated) model on a seeded random subset of n of the N windows and estimate
the full-window mean from the subset's residuals after the dense model's share is taken out. Every
window scores seqlen - 1 tokens, so the token-weighted mean is the plain mean of the windows' means.

With x the pruned and y the dense windows' mean NLL on the subset, Y the dense mean over all N
(`ESTIMATORS`):

- `difference`: x̄ - ȳ + Y, residuals (x - y) - (x̄ - ȳ), n - 1 degrees of freedom;
- `ratio`: x̄ / ȳ · Y, residuals x - (x̄ / ȳ) y, n - 1;
- `regression`: x̄ + b (Y - ȳ) with b the subset's least-squares slope of x on y, residuals
  (x - x̄) - b (y - ȳ), n - 2 (the default: it is the difference estimator where the damage adds
  a constant to every window and close to the ratio one where it scales them; docs/science.md §4);
- `unpaired`: x̄, residuals x - x̄ (no dense windows: a dense model's own evaluation).

The band is Student's t on the residuals with the finite-population correction sqrt(1 - n / N), so
it is a band for the full-window value: with n = N the estimate is x̄ itself and the band has width
zero. `estimate_sequentially` adds windows in the seeded order, a few at a time, until the band's
relative half width on PPL reaches the precision asked for, or every window is used.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import fmean

from core.prediction.sampling import t_quantile

FIRST_WINDOWS = 8
"""Windows scored before the first look at the band: fewer leave the residuals' spread too uncertain
for the band to be trusted (4 windows with a normal quantile covered 89 % of a claimed 95 %)."""
STEP_WINDOWS = 4
"""Windows added between looks at the band."""
BAND_LEVEL = 0.95
DEFAULT_PRECISION = 0.02
"""The relative half width of the 95 % band on PPL a simulation stops at unless asked otherwise."""
DEFAULT_ESTIMATOR = "regression"


@dataclass(frozen=True)
class Residuals:
    """An estimator's answer on a subset: its ln PPL estimate, residuals and degrees of freedom."""

    centre: float
    residuals: tuple[float, ...]
    df: int


def _difference(x: Sequence[float], y: Sequence[float], dense_mean: float) -> Residuals:
    gaps = [a - b for a, b in zip(x, y, strict=True)]
    mean_gap = fmean(gaps)
    return Residuals(mean_gap + dense_mean, tuple(g - mean_gap for g in gaps), len(x) - 1)


def _ratio(x: Sequence[float], y: Sequence[float], dense_mean: float) -> Residuals:
    ratio = fmean(x) / fmean(y)
    return Residuals(ratio * dense_mean, tuple(a - ratio * b for a, b in zip(x, y, strict=True)), len(x) - 1)


def _regression(x: Sequence[float], y: Sequence[float], dense_mean: float) -> Residuals:
    x_mean, y_mean = fmean(x), fmean(y)
    spread = sum((b - y_mean) ** 2 for b in y)
    if len(x) < 3 or spread == 0.0:  # no slope to read: the difference estimator
        return _difference(x, y, dense_mean)
    slope = sum((a - x_mean) * (b - y_mean) for a, b in zip(x, y, strict=True)) / spread
    residuals = tuple((a - x_mean) - slope * (b - y_mean) for a, b in zip(x, y, strict=True))
    return Residuals(x_mean + slope * (dense_mean - y_mean), residuals, len(x) - 2)


def _unpaired(x: Sequence[float], y: Sequence[float], dense_mean: float) -> Residuals:
    x_mean = fmean(x)
    return Residuals(x_mean, tuple(a - x_mean for a in x), len(x) - 1)


Estimator = Callable[[Sequence[float], Sequence[float], float], Residuals]
ESTIMATORS: dict[str, Estimator] = {
    "difference": _difference,
    "ratio": _ratio,
    "regression": _regression,
    "unpaired": _unpaired,
}
UNPAIRED = "unpaired"
DENSE_PAIRING = "dense"
"""`paired_with` of an estimate whose control variate is the dense model's windows."""


@dataclass(frozen=True)
class WindowEstimate:
    """ln PPL over `of_windows` windows estimated from `windows` of them, with its band."""

    nll_mean: float  # the estimate of the full-window mean NLL (ln PPL)
    stderr_log: float  # its standard error, finite-population corrected
    half_log: float  # the band's half width in ln PPL
    level: float
    windows: int
    of_windows: int
    estimator: str
    indices: tuple[int, ...]  # the windows scored, in the order they were scored
    window_nll: tuple[float, ...]  # their mean NLL, in that order
    paired_with: str = DENSE_PAIRING  # whose windows were the control variate (`curve_pairing`)

    @property
    def ppl(self) -> float:
        return math.exp(self.nll_mean)

    @property
    def low(self) -> float:
        return math.exp(self.nll_mean - self.half_log)

    @property
    def high(self) -> float:
        return math.exp(self.nll_mean + self.half_log)

    @property
    def relative_half_width(self) -> float:
        """The band's upper half width relative to PPL (the wider side of exp(±h))."""
        return math.expm1(self.half_log)

    @property
    def complete(self) -> bool:
        return self.windows == self.of_windows

    def to_dict(self, precision: float | None, order_seed: int) -> dict[str, object]:
        """The record a stored row carries (its protocol's `sampling`)."""
        return {
            "estimator": self.estimator,
            "paired_with": self.paired_with if self.estimator != UNPAIRED else None,
            "windows": self.windows,
            "of_windows": self.of_windows,
            "precision": precision,
            "reached": precision is None or self.relative_half_width <= precision,
            "level": self.level,
            "low": self.low,
            "high": self.high,
            "relative_half_width": self.relative_half_width,
            "stderr_log": self.stderr_log,
            "order_seed": order_seed,
            "window_indices": list(self.indices),
        }


def window_order(population: int, seed: int) -> list[int]:
    """Every window index of a protocol once, in the seeded order windows are added in."""
    order = list(range(population))
    random.Random(seed).shuffle(order)
    return order


def estimate(
    indices: Sequence[int],
    window_nll: Sequence[float],
    population: int,
    dense: Sequence[float] | None,
    *,
    estimator: str = DEFAULT_ESTIMATOR,
    level: float = BAND_LEVEL,
    paired_with: str = DENSE_PAIRING,
) -> WindowEstimate:
    """The estimate from the windows `indices` (distinct, of `population`) scoring `window_nll`, paired
    with `dense` (every window's mean NLL under the control variate, by index: the dense model's, or
    what `paired_with` names) unless it is None (then `unpaired`)."""
    count = len(indices)
    if count == 0 or count != len(window_nll):
        raise ValueError(
            f"need as many window NLLs as indices (at least one), got {len(window_nll)} for {count}"
        )
    if len(set(indices)) != count or min(indices) < 0 or max(indices) >= population:
        raise ValueError(f"window indices must be distinct and below {population}")
    name = UNPAIRED if dense is None else estimator
    if name not in ESTIMATORS:
        raise ValueError(f"unknown estimator {name!r}; known: {sorted(ESTIMATORS)}")
    if dense is not None and len(dense) != population:
        raise ValueError(f"{len(dense)} dense windows for a protocol of {population}")
    if count == population:  # every window: the full-window value itself, nothing to cover
        return WindowEstimate(
            fmean(window_nll),
            0.0,
            0.0,
            level,
            count,
            population,
            name,
            tuple(indices),
            tuple(window_nll),
            paired_with,
        )
    paired = [] if dense is None else [dense[index] for index in indices]
    found = ESTIMATORS[name](window_nll, paired, fmean(dense) if dense is not None else 0.0)
    if found.df < 1:  # one window: no spread to read, so no band worth the name
        stderr, half = math.inf, math.inf
    else:
        spread = math.sqrt(sum(r * r for r in found.residuals) / found.df)
        stderr = spread / math.sqrt(count) * math.sqrt(1.0 - count / population)
        half = t_quantile(0.5 + level / 2.0, found.df) * stderr
    return WindowEstimate(
        found.centre,
        stderr,
        half,
        level,
        count,
        population,
        name,
        tuple(indices),
        tuple(window_nll),
        paired_with,
    )


WindowScorer = Callable[[Sequence[int]], Sequence[float]]
"""Scores the windows of the given indices: their mean next-token NLL, in that order."""
EstimateProgress = Callable[[WindowEstimate], None]


def estimate_sequentially(
    score: WindowScorer,
    order: Sequence[int],
    precision: float | None,
    dense: Sequence[float] | None,
    *,
    scored: Sequence[float] = (),
    first: int = FIRST_WINDOWS,
    step: int = STEP_WINDOWS,
    estimator: str = DEFAULT_ESTIMATOR,
    level: float = BAND_LEVEL,
    paired_with: str = DENSE_PAIRING,
    progress: EstimateProgress | None = None,
) -> WindowEstimate:
    """Score windows in `order` (a permutation of the protocol's windows), `first` then `step` at a time,
    until the band's relative half width is at most `precision` or every window is scored (precision
    None: every window). `scored`: the mean NLL of the first windows of `order`, already scored
    elsewhere (a simulation's pilot)."""
    if precision is not None and not 0.0 < precision < 1.0:
        raise ValueError(f"precision must be in (0, 1), got {precision}")
    if first < 1 or step < 1:
        raise ValueError(f"first and step must be at least 1, got {first} and {step}")
    population = len(order)
    values = list(scored)
    taken = len(values)
    target = max(min(first, population), taken)
    while True:
        if target > taken:
            values += score(order[taken:target])
            taken = target
        found = estimate(
            order[:taken],
            values,
            population,
            dense,
            estimator=estimator,
            level=level,
            paired_with=paired_with,
        )
        if progress is not None:
            progress(found)
        if found.complete or (precision is not None and found.relative_half_width <= precision):
            return found
        target = min(population, taken + step)


def windows_needed(
    window_nll: Sequence[float],
    paired: Sequence[float],
    population: int,
    precision: float,
    *,
    estimator: str = DEFAULT_ESTIMATOR,
    level: float = BAND_LEVEL,
) -> int:
    """How many of `population` windows the band would need to reach `precision`, projected from the
    residual spread of a pilot: its windows' `window_nll` and the control variate `paired` on the same
    windows. The t quantile is the pilot's; the residuals do not depend on the control variate's mean
    over every window, so the pilot alone says what each way of pairing will cost."""
    count = len(window_nll)
    found = ESTIMATORS[estimator](window_nll, paired, 0.0)
    if found.df < 1:
        return population
    spread = math.sqrt(sum(r * r for r in found.residuals) / found.df)
    if spread == 0.0:
        return min(count, population)
    allowed = math.log1p(precision) / t_quantile(0.5 + level / 2.0, found.df)  # the stderr it may have
    unbounded = (spread / allowed) ** 2  # windows needed from an infinite protocol
    return min(population, max(count, math.ceil(unbounded / (1.0 + unbounded / population))))
