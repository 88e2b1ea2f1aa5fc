"""Request and response bodies. Job kinds form a discriminated union on `kind`.

Request models forbid unknown fields, so a typo is a 422 that names the field rather than a
silently ignored option.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Dtype = Literal["auto", "float32", "bfloat16", "float16"]
Device = Literal["auto", "cpu", "cuda"]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PerplexitySpec(StrictModel):
    """Token perplexity on a test split, non-overlapping windows (science.md §4)."""

    dataset: Literal["wikitext2"] = Field("wikitext2", description="Evaluation corpus (test split).")
    seqlen: int = Field(
        2048, ge=16, le=131_072, description="Window length in tokens; capped at the model's context."
    )
    max_windows: int | None = Field(
        None, ge=1, le=100_000, description="Score only the first N windows (cheap runs); null = all."
    )
    batch_size: int = Field(1, ge=1, le=64, description="Windows per forward pass.")


class ModelSpec(StrictModel):
    model: str = Field(
        min_length=1,
        max_length=512,
        description="Packaged alias (e.g. `smollm2-135m`), a local directory below "
        "PRUNECAST_MODEL_ROOTS, or a Hugging Face id present in the local HF cache.",
        examples=["smollm2-135m"],
    )
    revision: str | None = Field(None, max_length=128, description="HF revision (HF ids only).")
    dtype: Dtype = Field("auto", description="`auto`: float32 on CPU, bfloat16 on CUDA.")
    device: Device = "auto"
    seed: int = Field(42, ge=0, le=2**31 - 1, description="Seed for any sampling the job does.")


class EvaluateJobCreate(ModelSpec):
    """Measure a model as it is: perplexity (and, later, multiple-choice accuracy)."""

    kind: Literal["evaluate"]
    perplexity: PerplexitySpec = Field(default_factory=PerplexitySpec)


JobCreate = Annotated[EvaluateJobCreate, Field(discriminator="kind")]
JOB_KINDS = ("evaluate",)


class JobLinks(BaseModel):
    self: str
    wait: str
    results: str


class JobPublic(BaseModel):
    """A job as clients see it: request, lifecycle state and progress."""

    id: str
    kind: str
    status: Literal["queued", "running", "succeeded", "failed", "canceled"]
    model: str
    request: dict[str, Any]
    stage: str
    progress: float = Field(description="0..1 within the whole job.")
    detail: str | None = Field(None, description="Human-readable progress, e.g. 'window 7/20'.")
    error: str | None = Field(None, description="Why the job failed, was canceled or was retried.")
    attempts: int
    worker: str | None = Field(None, description="host:pid of the process running the current attempt.")
    cancel_requested: bool
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None
    environment: dict[str, Any] | None = Field(None, description="Versions and device of the run.")
    links: JobLinks


class JobList(BaseModel):
    items: list[JobPublic]
    next_cursor: str | None = Field(None, description="Pass as `cursor` to get the next page.")


class ResultPublic(BaseModel):
    """One measured (or predicted) number with everything needed to reproduce it."""

    id: int
    job_id: str | None
    model: str
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


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    checks: dict[str, str] = Field(default_factory=dict)
