"""The predictor each rung uses, fixed here with its reason before any curve scored it: the record a
verdict reads is then an honest held-out record, not the best of several predictors on the points
that judge it (which is optimistic by construction). The profile rung uses its entry only until other
models' records let it choose nested (`app.services.prediction.profile_rung._chosen_nested`): on both
models' curves the entries below lost to that choice (bench/README.md, `profile_records.py`).

The bench figures below were measured once (bench/simulate_curves.py, SmolLM2-135M and Gemma-3-270m)
and are used only where the store holds no record of its own; the answer says so.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProfilePredictor:
    feature: str
    reason: str


SLICING_PROFILE = ProfilePredictor(
    "lens-kl-sum",
    "the summed lens KL is itself a first-order estimate of the NLL increase in nats, so its law "
    "ln PPL - ln PPL0 = c F has c = 1 as a physical prior, which the pooled and own points refine",
)
MASK_PROFILE = ProfilePredictor(
    "output-error-depth-sum",
    "each block's share of output energy removed, compounded over the blocks it passes through: the "
    "mask methods' analogue of summing the lens KL over layers, linear in the loss to first order",
)

PROFILE_PREDICTORS: dict[str, ProfilePredictor] = {
    "slicegpt": SLICING_PROFILE,
    "wanda": MASK_PROFILE,
    "sparsegpt": MASK_PROFILE,
    "magnitude": MASK_PROFILE,
    "magnitude-row": MASK_PROFILE,
}
"""The profile rung's feature law per method: beta = 1 (a power law's exponent is one more number
to choose), its coefficient pooled from other curves and updated with the model's own points."""


@dataclass(frozen=True)
class BenchRecord:
    """A simulation engine's error measured on the bench: the worst |ln| miss of its face value over
    the bench's curves, and how many models and curves that was."""

    worst_log_error: float
    models: int
    curves: int
    source: str


SIMULATION_BENCH: dict[str, BenchRecord] = {
    "slicegpt": BenchRecord(
        0.074, 2, 2, "bench/simulate_curves.py: per-layer slicing, sequential bases from 24 of 32 windows"
    ),
    "wanda": BenchRecord(0.132, 2, 2, "bench/simulate_curves.py: Wanda's mask on dense-stream norms"),
}
"""Per method whose simulation is not exact: the bench's worst face-value miss (WikiText-2, 16 windows
of 512). Exact simulations (magnitude, stock slicing) need none; SparseGPT's Wanda-mask proxy has none
on purpose: it is not a bound (the bench measured it both above and below the truth)."""
