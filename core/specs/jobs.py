"""Job requests, one schema per kind, as a discriminated union on `kind`.

The API validates a request with these before it stores the job; the worker validates the stored
request again with the same schema, so both sides read one definition. Pruning rules come from
the method registry (`core.methods`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from core.methods import METHODS, UNSTRUCTURED
from core.specs.common import AccuracySpec, CalibrationSpec, ModelSpec, PerplexitySpec
from core.specs.probe import ProbeJobCreate
from core.specs.profile import ProfileJobCreate
from core.specs.pruning import (
    KEEP_BASES_DESCRIPTION,
    LAYOUT_DESCRIPTION,
    METHOD_DESCRIPTION,
    PATTERN_DESCRIPTION,
    ROUND_TO_DESCRIPTION,
    SLICE_HEAD_DESCRIPTION,
    SPARSITY_DESCRIPTION,
    PruneMethod,
    SlicedLayout,
    SparsityPattern,
)
from core.specs.simulate import SimulateJobCreate


class EvaluateJobCreate(ModelSpec):
    """Measure a model as it is: perplexity and/or multiple-choice accuracy."""

    kind: Literal["evaluate"]
    perplexity: PerplexitySpec | None = Field(
        default_factory=PerplexitySpec,
        description="Perplexity protocol; on (with its defaults) when omitted, null to skip it.",
    )
    accuracy: AccuracySpec | None = Field(None, description="Multiple-choice tasks to score; null: none.")

    @model_validator(mode="after")
    def _measures_something(self) -> EvaluateJobCreate:
        if self.perplexity is None and self.accuracy is None:
            raise ValueError("an evaluate job must measure something: give `perplexity`, `accuracy` or both")
        return self


class PruneJobCreate(ModelSpec):
    """Prune a model, then measure it: the dense baseline (measured once per model and protocol,
    then reused), the pruned perplexity and the real fraction of parameters removed."""

    kind: Literal["prune"]
    method: PruneMethod = Field(description=METHOD_DESCRIPTION)
    sparsity: float = Field(ge=0.0, lt=1.0, description=SPARSITY_DESCRIPTION, examples=[0.25])
    pattern: SparsityPattern = Field("unstructured", description=PATTERN_DESCRIPTION)
    round_to: int = Field(8, ge=1, le=128, description=ROUND_TO_DESCRIPTION)
    calibration: CalibrationSpec = Field(
        default_factory=CalibrationSpec,
        description="Calibration text: SliceGPT's PCAs, Wanda's activation norms, SparseGPT's Hessians, "
        "the drop methods' cosines and Block Influence. Unused by `magnitude`.",
    )
    perplexity: PerplexitySpec = Field(
        default_factory=PerplexitySpec,
        description="How the dense and pruned models are scored; the dense baseline is reused "
        "from an earlier job when model, data and this protocol match.",
    )
    accuracy: AccuracySpec | None = Field(
        None,
        description="Multiple-choice tasks to score the dense and the pruned model on; the dense "
        "accuracy is reused from an earlier job when model, data and this protocol match.",
    )
    save_artifact: bool = Field(
        True, description="Save the pruned model under the artifact directory (see `/artifacts`)."
    )
    slice_head: bool | None = Field(None, description=SLICE_HEAD_DESCRIPTION)
    layout: SlicedLayout | None = Field(None, description=LAYOUT_DESCRIPTION)
    keep_bases: bool = Field(True, description=KEEP_BASES_DESCRIPTION)

    @model_validator(mode="after")
    def _consistent_pruning(self) -> PruneJobCreate:
        METHODS[self.method].check(self.sparsity, self.pattern, self.slice_head, self.layout)
        return self


# Most sparsities one sweep may measure: each costs a slicing and an evaluation.
MAX_SWEEP_SPARSITIES = 20


class SweepJobCreate(ModelSpec):
    """Prune and measure a model at several sparsities, then fit the prediction laws to the points.

    One job: the model is loaded and the dense baseline measured (or reused) once, the calibration
    windows drawn once and shared by every sparsity; each sparsity stores the same results a `prune`
    job would (tagged with `sweep_job_id` in their protocol) as soon as it is measured; the fitted
    laws, with their quality on the measured points, are stored under `/v1/fits?job_id=...` once
    every sparsity is measured. A canceled sweep keeps nothing (like every canceled job); a retried
    one resumes from the sparsities its earlier attempt stored.
    """

    kind: Literal["sweep"]
    method: PruneMethod = Field(
        description=METHOD_DESCRIPTION + " Every method sweeps (unstructured; an N:M pattern has one "
        "sparsity): the drops at several layer fractions, the intra-layer pruners at several weight "
        "fractions. Only slicing's fits carry the strict law; the other methods' are empirical curves "
        "(law `empirical-...`)."
    )
    sparsities: list[Annotated[float, Field(ge=0.0, lt=1.0)]] = Field(
        min_length=1,
        max_length=10 * MAX_SWEEP_SPARSITIES,
        description=f"Sparsities to measure, each in [0, 1); sorted and deduplicated on submit, at most "
        f"{MAX_SWEEP_SPARSITIES} distinct values, at least one above 0. 0 stands for the dense "
        "baseline, which every sweep measures (or reuses) once anyway.",
        examples=[[0.0, 0.1, 0.2, 0.3, 0.4]],
    )
    round_to: int = Field(8, ge=1, le=128, description=ROUND_TO_DESCRIPTION)
    calibration: CalibrationSpec = Field(
        default_factory=CalibrationSpec,
        description="Drawn once; every sparsity is pruned with the same windows (unused by `magnitude`).",
    )
    perplexity: PerplexitySpec = Field(
        default_factory=PerplexitySpec,
        description="How the dense and pruned models are scored; the dense baseline is reused "
        "from an earlier job when model, data and this protocol match.",
    )
    accuracy: AccuracySpec | None = Field(
        None,
        description="Multiple-choice tasks to score the dense model (once, or reused from an earlier "
        "job when model, data and this protocol match) and every pruned sparsity on; an accuracy law "
        "is fitted and stored per task and metric besides the perplexity law.",
    )
    save_artifacts: bool = Field(
        False,
        description="Save every sliced model under the artifact directory (`<job id>/s<sparsity>`).",
    )
    slice_head: bool | None = Field(None, description=SLICE_HEAD_DESCRIPTION)
    layout: SlicedLayout | None = Field(None, description=LAYOUT_DESCRIPTION)
    keep_bases: bool = Field(True, description=KEEP_BASES_DESCRIPTION)
    fan_out: bool | None = Field(
        None,
        description="true: measure each sparsity in a child `prune` job of its own (listed with "
        "`parent_id` = this sweep), so that several workers prune the sparsities at once; this sweep "
        "measures the dense baseline, takes children itself while any is queued, and fits the laws once "
        "every child succeeded. Canceling the sweep cancels its children; a retried sweep keeps the "
        "finished ones. The stored numbers are the same either way. false: one worker measures every "
        "sparsity in turn. null (default): fan out when the sweep starts measuring and more than one "
        "worker listens on its queue (and it has more than one sparsity to prune), else in turn.",
    )

    @field_validator("sparsities")
    @classmethod
    def _sorted_distinct_with_a_pruned_one(cls, value: list[float]) -> list[float]:
        distinct = sorted({s + 0.0 for s in value})  # + 0.0 turns -0.0 into 0.0
        if len(distinct) > MAX_SWEEP_SPARSITIES:
            raise ValueError(
                f"{len(distinct)} distinct sparsities, at most {MAX_SWEEP_SPARSITIES} per sweep; "
                "split the list over several sweeps"
            )
        if distinct[-1] == 0.0:
            raise ValueError("a sweep needs at least one sparsity above 0 (0 is the dense baseline)")
        return distinct

    @model_validator(mode="after")
    def _consistent_pruning(self) -> SweepJobCreate:
        METHODS[self.method].check(max(self.sparsities), UNSTRUCTURED, self.slice_head, self.layout)
        return self

    @property
    def pruned_sparsities(self) -> list[float]:
        """The sparsities that are sliced: every requested one but 0."""
        return [s for s in self.sparsities if s > 0.0]


JobCreate = Annotated[
    EvaluateJobCreate
    | PruneJobCreate
    | SweepJobCreate
    | ProbeJobCreate
    | ProfileJobCreate
    | SimulateJobCreate,
    Field(discriminator="kind"),
]
JOB_KINDS = ("evaluate", "prune", "sweep", "probe", "profile", "simulate")
