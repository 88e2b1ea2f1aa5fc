"""Which windows a simulated curve's points are paired with: the dense model's, or one of its own points.

The paired estimator (`core.prediction.paired_windows`) needs a control variate known on every window.
The dense model's windows are one. A point of the same curve scored on every window is another, and
where the damage differs much from window to window (slicing), it follows the other points far more
closely than the dense model does: on SmolLM2-135M's SliceGPT curve (s = 0.1..0.5, 40 WikiText-2
windows of 512) a band from 8 windows was ±7 % paired with the point at 0.3 against ±24 % paired with
the dense windows, while Wanda's points were as well paired with the dense windows, which cost no
window of their own (bench/README.md, `window_covariates.py`).

So a curve chooses from its pilot, the first windows of its seeded order that every point scored:
the middle point of the curve becomes the reference, scored on every window, and the others are
paired with it, when the windows the pilot projects for that (the reference's every window plus
the others' `windows_needed`) are fewer than those it projects for pairing every point with the
dense windows. The rule was fixed on SmolLM2's SliceGPT and Wanda curves before it was scored on
Gemma-3-270m's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from core.prediction.paired_windows import windows_needed

MIN_POINTS = 3
"""Points a curve needs before one of them is worth scoring on every window for the others."""


def middle_point(sparsities: Sequence[float]) -> float:
    """The reference a curve would use: the middle of its sparsities (the upper middle of an even count)."""
    ordered = sorted(sparsities)
    return ordered[len(ordered) // 2]


def choose_reference(
    pilots: Mapping[float, Sequence[float]],
    dense_pilot: Sequence[float],
    population: int,
    precision: float,
) -> float | None:
    """The sparsity whose point the others are paired with, or None for the dense windows. `pilots`:
    each point's mean NLL on the pilot windows, `dense_pilot` the dense model's on the same windows,
    in the same order; `population`: the protocol's windows."""
    if len(pilots) < MIN_POINTS or any(len(nll) != len(dense_pilot) for nll in pilots.values()):
        return None
    if len(dense_pilot) >= population:  # every window scored already: nothing to save
        return None
    reference = middle_point(list(pilots))
    with_dense = sum(windows_needed(nll, dense_pilot, population, precision) for nll in pilots.values())
    with_reference = population + sum(
        windows_needed(nll, pilots[reference], population, precision)
        for sparsity, nll in pilots.items()
        if sparsity != reference
    )
    return reference if with_reference < with_dense else None
