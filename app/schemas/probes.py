"""What clients see of a probe job's points and how well the Taylor estimates track them."""

from __future__ import annotations

from pydantic import BaseModel, Field

from app.schemas.base import FromRow
from core.probe_conventions import CONVENTION_DESCRIPTION
from core.specs.probe import PROBE_KIND_DESCRIPTION, PROBE_METRIC_DESCRIPTION, PROBE_SPACE_DESCRIPTION


class ProbePointPublic(FromRow):
    """One probe measurement: the measured deviation and, where one exists, its Taylor estimate."""

    id: int
    job_id: str
    probe: str = Field(description=PROBE_KIND_DESCRIPTION)
    layer: int | None = Field(description="Block index from 0; null: the model's output.")
    sublayer: str | None = Field(description="`attention`, `mlp` or `block`; null where it does not apply.")
    space: str = Field(description=PROBE_SPACE_DESCRIPTION)
    step: int | None = Field(description="Generation step from 0; null outside generation probes.")
    metric: str = Field(description=PROBE_METRIC_DESCRIPTION)
    value: float = Field(description="Measured (ground truth).")
    estimate: float | None = Field(description="Taylor estimate of `value` (docs/science.md §3); null: none.")
    n: int | None = Field(None, description="Tokens (or prompts) the mean is over; null on older points.")
    stderr: float | None = Field(
        None,
        description="Sample sd / sqrt(n) of the values, as if the tokens were independent (a lower bound).",
    )
    value_min: float | None = Field(None, description="Smallest value over those tokens.")
    value_max: float | None = Field(None, description="Largest value over those tokens.")
    convention: str = Field("prunecast", description=CONVENTION_DESCRIPTION)


class ProbeSummary(BaseModel):
    """How well the Taylor estimates track the measured values, for one probe, sublayer, space and
    metric, over every matching point that has an estimate (all layers, not just one page)."""

    probe: str
    convention: str = Field("prunecast", description="The rules the points were read by; never pooled.")
    decoding_steps: bool = Field(
        False,
        description="True: counterfactual points measured at decoding steps of the dense model's "
        "greedy generation; false: on the prompts.",
    )
    sublayer: str | None
    space: str
    metric: str
    n: int = Field(description="Points with an estimate.")
    correlation: float | None = Field(
        description="Pearson correlation of estimate and value across the points; null with fewer than "
        "3 points or when either does not vary."
    )
    mean_value: float
    mean_estimate: float
    mean_relative_error: float | None = Field(
        description="Mean of |estimate - value| / |value| over the points with value != 0."
    )


class ProbePointList(BaseModel):
    items: list[ProbePointPublic] = Field(description="One page, in the order the job stored them.")
    next_cursor: str | None = Field(None, description="Pass as `cursor` to get the next page.")
    summary: list[ProbeSummary] = Field(
        description="Estimate against value per (probe, sublayer, space, metric), over all matching points."
    )
