"""A task score over every doc of a protocol from a few docs, paired with the dense model's own.

Pruning flips few answers: a pruned (or simulated) model is right where its dense model is right on
most docs. The dense model's right-or-wrong record on every doc is stored with its score, so the
pruned model is scored on a seeded random subset of k of the N docs and only the *difference* is
estimated from them: with d_i = pruned_i - dense_i (each doc right or wrong under both, so d_i is
-1, 0 or +1),

    estimate = dense accuracy over all N + mean of d over the k docs scored,

which with k = N is the pruned model's full-doc score itself. Its standard error is that of a
paired difference of proportions with 0.5 added to each cell of the 2 x 2 table of the k docs
(Agresti & Min 2005: without it, a subset in which no answer flipped would claim a band of width
zero), with the finite-population correction sqrt((N - k) / (N - 1)), so it is a band for the
full-doc value and has width zero at k = N. Docs are added in the seeded order, a few at a time,
until the band's half width (in accuracy, not relative) reaches the precision asked for or every
doc is used (docs/science.md §4, "Task scores to a precision").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

from core.prediction.paired_windows import BAND_LEVEL, window_order

FIRST_DOCS = 32
"""Docs scored before the first look at the band: with 0.5 per cell, 32 docs without a flip already
give ±5.8 points, so no early look can stop on luck."""
STEP_DOCS = 16
"""Docs added between looks at the band."""
DEFAULT_DOC_PRECISION = 0.02
"""The half width of the 95 % band on a task score (in accuracy) a simulation stops at unless asked."""
ESTIMATOR = "paired difference to the dense docs, 0.5 added to each cell (Agresti-Min)"

doc_order = window_order
"""Every doc index once, in the seeded order docs are added in (the windows' seeded shuffle)."""


@dataclass(frozen=True)
class DocEstimate:
    """A task score over all `of_docs` docs, estimated from `docs` of them paired with the dense ones."""

    value: float  # the estimate of the full-doc score, clipped to [0, 1]
    stderr: float  # of `value` as an estimate of the full-doc score (0 when every doc was scored)
    docs: int
    of_docs: int
    gains: int  # docs right under the pruned model, wrong under the dense one
    losses: int  # docs wrong under the pruned model, right under the dense one
    level: float

    @property
    def half_width(self) -> float:
        return NormalDist().inv_cdf(0.5 + self.level / 2) * self.stderr

    @property
    def low(self) -> float:
        return max(0.0, self.value - self.half_width)

    @property
    def high(self) -> float:
        return min(1.0, self.value + self.half_width)

    @property
    def complete(self) -> bool:
        return self.docs == self.of_docs

    def to_dict(self, precision: float | None, order_seed: int) -> dict[str, object]:
        """What a stored row says of the docs its value rests on."""
        return {
            "docs": self.docs,
            "of_docs": self.of_docs,
            "gains": self.gains,
            "losses": self.losses,
            "stderr": self.stderr,
            "level": self.level,
            "low": self.low,
            "high": self.high,
            "precision": precision,
            "order_seed": order_seed,
            "estimator": ESTIMATOR,
        }


def estimate_score(
    scored: dict[int, float], dense: Sequence[float], level: float = BAND_LEVEL
) -> DocEstimate:
    """The full-doc score from the pruned model's scores on the docs `scored` (doc index -> 0 or 1)
    and the dense model's score on every doc (`dense`, in doc order)."""
    population = len(dense)
    if not scored or population == 0:
        raise ValueError("a paired task score needs at least one scored doc and the dense docs")
    if any(index < 0 or index >= population for index in scored):
        raise ValueError(f"doc indices must lie in [0, {population})")
    k = len(scored)
    gains = sum(1 for i, right in scored.items() if right > dense[i])
    losses = sum(1 for i, right in scored.items() if right < dense[i])
    if k == population:  # the pruned model's own full-doc score, not an estimate of it
        return DocEstimate(sum(scored.values()) / k, 0.0, k, population, gains, losses, level)
    value = min(1.0, max(0.0, sum(dense) / population + (gains - losses) / k))
    cells = k + 2.0  # four cells, 0.5 each
    p_gain, p_loss = (gains + 0.5) / cells, (losses + 0.5) / cells
    variance = (p_gain + p_loss - (p_gain - p_loss) ** 2) / cells
    correction = (population - k) / (population - 1)
    return DocEstimate(value, math.sqrt(variance * correction), k, population, gains, losses, level)


def score_to_precision(
    score_docs: Callable[[list[int]], dict[str, list[float]]],
    dense: Mapping[str, Sequence[float]],
    precision: float,
    order_seed: int,
    *,
    level: float = BAND_LEVEL,
    on_look: Callable[[dict[str, DocEstimate]], None] | None = None,
) -> dict[str, DocEstimate]:
    """Score docs in the seeded order (`score_docs(indices)` -> metric -> each doc's 0 or 1) until
    every metric's band half width is at most `precision`, or every doc is scored."""
    population = len(next(iter(dense.values())))
    order = doc_order(population, order_seed)
    scored: dict[str, dict[int, float]] = {metric: {} for metric in dense}
    used = 0
    while True:
        upto = min(population, FIRST_DOCS if used == 0 else used + STEP_DOCS)
        batch = order[used:upto]
        found = score_docs(batch)
        for metric in dense:
            scored[metric].update(zip(batch, found[metric], strict=True))
        used = upto
        estimates = {metric: estimate_score(scored[metric], dense[metric], level) for metric in dense}
        if on_look is not None:
            on_look(estimates)
        if used == population or all(e.half_width <= precision for e in estimates.values()):
            return estimates
