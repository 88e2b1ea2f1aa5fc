"""A simulated curve scaled through measured points of the same model, method and protocol.

A simulation carries a model's shape but not always its scale (docs/science.md §2, "Simulated
curves"): SliceGPT's dense-stream bases, or a subset of the calibration windows, make the simulated
log-increase L_sim(s) = ln(PPL_sim(s) / PPL0) a near-constant multiple of the measured one. So

    ln(PPL(s) / PPL0) = c(s) * L_sim(s),

with c from anchors (sparsities where the method itself was run): one anchor gives a constant c (the
only form one number can pin); two or more give c linear in s, fitted by least squares (through both
points when there are two), because the measured ratio drifts with s and a line is the lowest order
that follows a drift. The curve passes through each anchor exactly when there are at most two.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

SIMULATED_ROLE = "simulated"
"""A stored simulated point of the cheap simulation (its face value): `protocol.simulation.role`."""
ANCHOR_ROLE = "anchor"
"""A stored simulated point where the method itself ran through the simulation's passes."""
ANCHORED_LAW = "anchored"
"""The `law` of the rows that hold the simulated curve scaled through its anchors."""

MIN_LOG_INCREASE = 1e-6
"""A simulated log-increase below this (the dense point, s = 0) cannot pin c and is skipped."""


@dataclass(frozen=True)
class Anchor:
    """One sparsity where both the simulation and the method itself were run."""

    sparsity: float
    simulated: float  # perplexity of the simulation at this sparsity
    measured: float  # perplexity of the method itself


@dataclass(frozen=True)
class AnchoredScale:
    """c(s) = intercept + slope * s; `form` is "constant" (slope 0) or "linear"."""

    form: str
    intercept: float
    slope: float
    anchors: tuple[Anchor, ...]

    def factor(self, sparsity: float) -> float:
        return self.intercept + self.slope * sparsity

    def apply(self, sparsity: float, simulated: float, dense: float) -> float:
        """The anchored perplexity at `sparsity` from the simulated one."""
        return dense * math.exp(self.factor(sparsity) * math.log(simulated / dense))

    def to_dict(self) -> dict[str, object]:
        return {
            "form": self.form,
            "intercept": self.intercept,
            "slope": self.slope,
            "anchors": [asdict(anchor) for anchor in self.anchors],
        }


def ratio(anchor: Anchor, dense: float) -> float | None:
    """ln(measured / PPL0) / ln(simulated / PPL0), or None where the simulation did not move."""
    simulated = math.log(anchor.simulated / dense)
    if abs(simulated) < MIN_LOG_INCREASE:
        return None
    return math.log(anchor.measured / dense) / simulated


def fit_scale(anchors: Sequence[Anchor], dense: float) -> AnchoredScale | None:
    """c(s) through the anchors (module docstring), or None when no anchor moved the simulation."""
    usable = [(a, r) for a in sorted(anchors, key=lambda a: a.sparsity) if (r := ratio(a, dense)) is not None]
    if not usable:
        return None
    kept = tuple(a for a, _ in usable)
    if len({a.sparsity for a in kept}) == 1:
        mean = sum(r for _, r in usable) / len(usable)
        return AnchoredScale("constant", mean, 0.0, kept)
    xs = [a.sparsity for a in kept]
    ys = [r for _, r in usable]
    x_mean, y_mean = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - x_mean) * (y - y_mean) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - x_mean) ** 2 for x in xs
    )
    return AnchoredScale("linear", y_mean - slope * x_mean, slope, kept)
