"""What clients see of measured numbers, and their lm-evaluation-harness export."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from app.schemas.base import FromRow, ModelId


class ResultPublic(FromRow):
    """One measured (or predicted) number with everything needed to reproduce it."""

    id: int
    job_id: str | None
    model: ModelId
    model_revision: str | None
    method: str
    sparsity: float
    metric: str
    dataset: str
    split: str | None
    value: float
    stderr: float | None
    n: int | None
    source: str
    law: str | None
    protocol: dict[str, Any]
    created_at: datetime


class ResultList(BaseModel):
    items: list[ResultPublic]
    next_cursor: str | None = None


class LmEvalExport(BaseModel):
    """A job's task scores in lm-evaluation-harness's results format (`results_*.json`): per task
    `acc,none`, `acc_stderr,none`, `acc_norm,none`, `acc_norm_stderr,none` (LAMBADA: `perplexity,none`
    and `acc,none`; GSM8K: `exact_match,strict-match`, `exact_match,flexible-extract` and their
    stderrs) and `alias`; what lm-eval
    has no place for (job, method, sparsity, dense baseline, perplexity) is under `prunecast`."""

    model_config = ConfigDict(populate_by_name=True)

    results: dict[str, dict[str, Any]] = Field(description="Task -> lm-eval metric keys -> value.")
    groups: dict[str, Any] = Field(default_factory=dict)
    configs: dict[str, dict[str, Any]] = Field(description="Task -> how it was scored.")
    versions: dict[str, float | None]
    n_shot: dict[str, int] = Field(alias="n-shot")
    higher_is_better: dict[str, dict[str, bool]]
    n_samples: dict[str, dict[str, int]] = Field(alias="n-samples", description="original / effective docs.")
    config: dict[str, Any] = Field(description="model, model_args, batch_size, device, limit.")
    model_name: str
    model_revision: str | None = None
    prunecast: dict[str, Any] = Field(description="job_id, kind, method, sparsity, dense, perplexity.")
