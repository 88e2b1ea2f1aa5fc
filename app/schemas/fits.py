"""What clients see of the laws sweeps fitted to measured points, and their quality."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from app.schemas.base import FromRow, ModelId


class FitPointPublic(BaseModel):
    sparsity: float = Field(description="0 is the dense baseline the laws are anchored at.")
    value: float | None = Field(description="The measured value; null when it was not finite.")
    result_id: int | None = Field(description="The result row it was measured as (`/v1/results`).")
    used: bool = Field(description="False when left out of the fit (e.g. an infinite perplexity).")


class LawQualityPublic(BaseModel):
    """How one law matched the measured points it was fitted on."""

    n: int = Field(description="Pruned points compared.")
    r2: float | None = Field(description="Coefficient of determination; null with fewer than 2 points.")
    max_ape: float | None = Field(description="Largest absolute percentage error, as a fraction.")
    mean_ape: float | None = Field(description="Mean absolute percentage error, as a fraction.")
    loo_rel_error: float | None = Field(
        description="RMS relative error predicting each point from the others (leave-one-out); "
        "null when too few points or for the strict law, which has nothing fitted."
    )
    formula: str
    params: dict[str, float | None]
    sigma: float | None = Field(
        description="Relative error of one measurement about the law (prior pooled with residuals)."
    )
    band_from_prior: bool | None = Field(
        description="True when sigma is the prior alone (no spare points); null for the strict law."
    )


class FitPublic(FromRow):
    """A law fitted to one model's measured points under one method, metric and protocol."""

    id: int
    job_id: str | None
    model: ModelId
    model_revision: str | None
    method: str
    metric: str
    dataset: str
    protocol: dict[str, Any] = Field(
        description="What the points share: perplexity protocol (seqlen, max_windows, data_sha256, "
        "dtype), calibration windows, round_to, slice_head."
    )
    law: str = Field(description="The chosen law: `alpha` (one parameter) or `affine` (two).")
    formula: str
    params: dict[str, float | None]
    baseline: float = Field(description="The measured dense value the law is anchored at (PPL0).")
    points: list[FitPointPublic] = Field(description="Dense point first, then by sparsity.")
    quality: dict[str, LawQualityPublic] = Field(
        description="Per law (each candidate, and `strict` for perplexity) on the measured points."
    )
    chosen_reason: str
    created_at: datetime


class FitList(BaseModel):
    items: list[FitPublic]
    next_cursor: str | None = Field(None, description="Pass as `cursor` to get the next page.")
