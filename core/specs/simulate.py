"""Simulate job requests: a method's whole perplexity curve from passes over the dense model, unpruned.

docs/science.md §2 ("Simulated curves") says what a simulation computes and how close it comes.
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import Field, field_validator, model_validator

from core.methods import METHODS, STOCK_LAYOUT, UNSTRUCTURED, Simulation, simulated_methods
from core.specs.common import CalibrationSpec, ModelSpec, SimulatedAccuracySpec, SimulatedPerplexitySpec
from core.specs.pruning import LAYOUT_DESCRIPTION, ROUND_TO_DESCRIPTION, SLICE_HEAD_DESCRIPTION, SlicedLayout

SimulatedMethod = Literal["slicegpt", "magnitude", "magnitude-row", "wanda", "sparsegpt"]
if set(get_args(SimulatedMethod)) != set(simulated_methods()):
    raise AssertionError("SimulatedMethod must list exactly core.methods.simulated_methods()")

BasisSource = Literal["dense", "sequential"]
BasisDtype = Literal["float32", "bfloat16"]
WindowDtype = Literal["float32", "bfloat16"]
DEFAULT_BASES: BasisSource = "sequential"
"""Per-layer slicing's default: bases of the projected stream, as SliceGPT takes them (dense-stream
bases were 0.29-0.41 off at the median; bench/README.md, "simulate_curves.py")."""
DEFAULT_BASIS_FRACTION = 0.75
"""Float32 `sequential` bases come from this share of the calibration windows unless `basis_windows`
says. Fixed after SmolLM2's 8- and 16-of-32-window errors (0.225, 0.106) fell like 1/windows, before
Gemma ran; at 24 of 32 the median error was 0.027 (SmolLM2) and 0.022 (Gemma), at about a sweep's
cost. Bfloat16 streams take every window: on SmolLM2 they were 0.0047 from SliceGPT's own bases
there for 0.58x slicing's passes, where three quarters left 0.025 (bench/README.md,
`basis_windows.py`), most of a 0.03 error budget before any window is sampled."""
MIN_BASIS_WINDOWS = 8
MAX_SIMULATED_SPARSITIES = 20
MAX_ANCHORS = 4


class SimulateJobCreate(ModelSpec):
    """Simulate what pruning would do to a model's perplexity at every requested sparsity, from passes
    over the dense model: SliceGPT as the dense model with each residual signal projected on the top-d
    directions of its basis; the mask methods as the dense model with their masks applied to the
    weights for the length of one forward (`sparsegpt` by Wanda's mask without its weight update: a
    proxy, labelled so). Nothing is pruned or saved. Points are stored with `source: simulated`, apart
    from measured ones, and with `accuracy` each sparsity's task scores too; `anchors` also runs the
    method itself at those sparsities (through the same passes, no weight surgery) and stores the
    curve scaled through them (`law: anchored`)."""

    kind: Literal["simulate"]
    method: SimulatedMethod = Field(
        description="The method to simulate; the drop methods have no simulation (prune them)."
    )
    sparsities: list[Annotated[float, Field(ge=0.0, lt=1.0)]] = Field(
        default_factory=lambda: [0.1, 0.2, 0.3, 0.4, 0.5],
        min_length=1,
        max_length=10 * MAX_SIMULATED_SPARSITIES,
        description=f"Sparsities to simulate (sorted and deduplicated; at most {MAX_SIMULATED_SPARSITIES}). "
        "All of them share one pass block by block; each costs one evaluation of the windows.",
    )
    anchors: list[Annotated[float, Field(gt=0.0, lt=1.0)]] = Field(
        default_factory=list,
        max_length=MAX_ANCHORS,
        description="Sparsities at which the method itself also runs (SliceGPT: its own sequential bases "
        "from every calibration window; Wanda and SparseGPT: statistics of the pruned stream; magnitude "
        "needs none: its simulation is exact). One anchor scales the simulated log-increase by a "
        "constant, two or more by a line in the sparsity; the scaled curve is stored as `law: anchored`.",
    )
    bases: BasisSource | None = Field(
        None,
        description="`slicegpt` per-layer only. `sequential` (null means this): each sparsity's bases come "
        "from the calibration stream projected at its own width, block by block, as SliceGPT takes them, "
        "from `basis_windows` of the calibration windows. `dense`: every basis from the dense stream "
        "(one calibration pass for all sparsities; cheaper, and further from the method).",
    )
    basis_windows: int | None = Field(
        None,
        ge=1,
        description="`sequential` bases: how many calibration windows they are taken from. null: every "
        "one where the streams run in bfloat16 (`basis_dtype`), else "
        f"{DEFAULT_BASIS_FRACTION:g} of `calibration.num_sequences` (at least {MIN_BASIS_WINDOWS}). "
        "The result's `simulation.basis_windows` says how many.",
    )
    basis_dtype: BasisDtype | None = Field(
        None,
        description="`slicegpt` per-layer only: the dtype the bases' calibration streams run in (the model, "
        "the evaluation windows and the anchors stay in `dtype`). null: bfloat16 for a float32 model where "
        "the device computes it natively (CUDA from Ampere on, a CPU with AVX512-BF16 or AMX), which "
        "halves the streams' time and moved SmolLM2's curve by 0.005 in ln PPL at the median; else "
        "`dtype`. The result's `simulation.basis_dtype` says which ran.",
    )
    window_dtype: WindowDtype | None = Field(
        None,
        description="With a `perplexity.precision` only: the dtype a face value's windows scored to reach "
        "the precision run in, on a copy of the model, each window corrected by the dense model's own gap "
        "between that dtype and `dtype` on it; without anchors the 8-window pilot runs there too (an "
        "anchor rests on a pilot scored in `dtype`). null: for `slicegpt` per-layer, bfloat16 for a "
        'resident float32 model where the device computes it natively (docs/science.md, "Simulated '
        'curves", says what it cost in error), else `dtype`; for the mask methods `dtype`, so that '
        "magnitude's simulation stays the pruned model itself (bfloat16 must be asked for: the masks "
        "are still picked on the `dtype` weights, and the row is then not `exact`). Not for the stock "
        "layout, which simulates the method itself. The result's `simulation.window_dtype` says which "
        "ran.",
    )
    round_to: int = Field(8, ge=1, le=128, description=ROUND_TO_DESCRIPTION)
    slice_head: bool | None = Field(None, description=SLICE_HEAD_DESCRIPTION)
    layout: SlicedLayout | None = Field(
        None,
        description=LAYOUT_DESCRIPTION + " The stock layout's one basis comes from the dense stream, as "
        "the method takes it, so its simulation is the sliced model itself.",
    )
    calibration: CalibrationSpec = Field(
        default_factory=CalibrationSpec,
        description="The calibration a prune of the same request would draw (unused by `magnitude`).",
    )
    perplexity: SimulatedPerplexitySpec = Field(
        default_factory=SimulatedPerplexitySpec,
        description="The evaluation windows every sparsity is scored on; the dense baseline (with its "
        "per-window NLL) is reused from an earlier job when model, data and this protocol match. With "
        "`precision` (default 0.02) each sparsity is scored on a seeded subset of the windows paired "
        "with the dense model's and carries a band for the full-window value; null scores every window. "
        "`max_windows` below the full split with precision null carries a sampling band for the "
        "full-split value.",
    )

    accuracy: SimulatedAccuracySpec | None = Field(
        None,
        description="Tasks to score on each simulated sparsity's model, as a prune job scores its pruned "
        "model (the dense scores reused when model, data and this protocol match): multiple choice, "
        "LAMBADA and GSM8K alike, through the model's own forward with the signals projected or the "
        "weights masked as at face value. With `precision` (default 0.02) each sparsity scores a "
        "seeded subset of the docs paired with the dense model's, and its band covers the every-doc "
        "score; null scores every doc. Anchors are not task-scored; null: none.",
    )

    @field_validator("sparsities", "anchors")
    @classmethod
    def _sorted_distinct(cls, value: list[float]) -> list[float]:
        distinct = sorted({s + 0.0 for s in value})
        if len(distinct) > MAX_SIMULATED_SPARSITIES:
            raise ValueError(f"{len(distinct)} distinct sparsities, at most {MAX_SIMULATED_SPARSITIES}")
        return distinct

    @model_validator(mode="after")
    def _consistent(self) -> SimulateJobCreate:
        entry = METHODS[self.method]
        entry.check(max(self.sparsities + self.anchors), UNSTRUCTURED, self.slice_head, self.layout)
        if self.bases is not None and (
            entry.simulation is not Simulation.projection or self.layout == STOCK_LAYOUT
        ):
            raise ValueError(
                "bases applies to slicegpt in the per-layer layout only (the stock layout's one basis and "
                "the mask methods' statistics have no choice of stream); leave it null"
            )
        if self.basis_dtype is not None and (
            entry.simulation is not Simulation.projection or self.layout == STOCK_LAYOUT
        ):
            raise ValueError(
                "basis_dtype applies to slicegpt in the per-layer layout only (the stock layout's basis is "
                "slicing's own pooled pass; the mask methods have no basis streams); leave it null"
            )
        if self.window_dtype is not None and self.layout == STOCK_LAYOUT:
            raise ValueError(
                "window_dtype does not apply to the stock layout (its simulation is the sliced model "
                "itself, in `dtype`); leave it null"
            )
        if self.window_dtype is not None and self.perplexity.precision is None:
            raise ValueError(
                "window_dtype applies to the windows scored past the pilot to reach perplexity.precision; "
                "with precision null every window is scored in the pass, in `dtype`; leave it null"
            )
        if self.basis_windows is not None and (
            entry.simulation is not Simulation.projection
            or self.layout == STOCK_LAYOUT
            or self.bases == "dense"
        ):
            raise ValueError(
                "basis_windows applies to sequential bases (slicegpt per-layer) only; leave it null"
            )
        if self.basis_windows is not None and self.basis_windows > self.calibration.num_sequences:
            raise ValueError(
                f"basis_windows {self.basis_windows} exceeds calibration.num_sequences "
                f"{self.calibration.num_sequences}"
            )
        return self

    @property
    def basis_source(self) -> BasisSource:
        """The per-layer bases' stream (meaningful for per-layer slicing only)."""
        return self.bases or DEFAULT_BASES

    def sequential_windows(self, streams_in_bfloat16: bool) -> int:
        """Calibration windows each sparsity's sequential bases are taken from: all of them where the
        streams run in bfloat16, which costs less than three quarters in float32 and is closer."""
        if self.basis_windows is not None:
            return self.basis_windows
        if streams_in_bfloat16:
            return self.calibration.num_sequences
        share = round(DEFAULT_BASIS_FRACTION * self.calibration.num_sequences)
        return min(self.calibration.num_sequences, max(MIN_BASIS_WINDOWS, share))
