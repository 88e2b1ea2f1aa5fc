"""Request and response bodies. Job kinds form a discriminated union on `kind`.

Request models forbid unknown fields, so a typo is a 422 that names the field rather than a
silently ignored option.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

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


# Longest calibration text a request may carry (characters). The request body limit
# (PRUNECAST_MAX_BODY_BYTES) applies first, so raise that too to send texts this long.
MAX_CALIBRATION_TEXT_CHARS = 2_000_000


class CalibrationSpec(StrictModel):
    """The text SliceGPT's PCAs are computed on: `num_sequences` windows of `seqlen` tokens drawn
    at seeded random offsets from one corpus (science.md §1, step 7)."""

    corpus: Literal["boolq-passages", "text"] = Field(
        "boolq-passages",
        description="`boolq-passages`: the packaged BoolQ Wikipedia passages (English prose, ~1.6M "
        "characters; never the evaluation split). `text`: the `text` field of this request.",
    )
    text: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_CALIBRATION_TEXT_CHARS,
        description="Your own calibration text; required when `corpus` is `text`, refused otherwise. "
        "It must hold at least `seqlen` tokens. Also bounded by the server's request body limit.",
    )
    num_sequences: int = Field(
        128, ge=1, le=4096, description="Calibration windows (SliceGPT uses 128; 1024 does better)."
    )
    seqlen: int = Field(
        2048, ge=16, le=32_768, description="Tokens per window; capped at the model's context length."
    )
    batch_size: int = Field(8, ge=1, le=256, description="Windows per forward pass while slicing.")
    seed: int | None = Field(
        None,
        ge=0,
        le=2**31 - 1,
        description="Seed of the window offsets; null uses the job's `seed` (default 42).",
    )

    @model_validator(mode="after")
    def _text_iff_corpus_is_text(self) -> CalibrationSpec:
        if self.corpus == "text" and self.text is None:
            raise ValueError("calibration.text is required when calibration.corpus is 'text'")
        if self.corpus != "text" and self.text is not None:
            raise ValueError(
                f"calibration.text is only read when calibration.corpus is 'text' (got {self.corpus!r})"
            )
        return self


class PruneJobCreate(ModelSpec):
    """Prune a model, then measure it: the dense baseline (measured once per model and protocol,
    then reused), the pruned perplexity and the real fraction of parameters removed."""

    kind: Literal["prune"]
    method: Literal["slicegpt"] = Field(
        description="`slicegpt`: remove a fraction of the residual-stream width (SliceGPT, ICLR 2024)."
    )
    sparsity: float = Field(
        ge=0.0,
        lt=1.0,
        description="Fraction removed. For `slicegpt` the fraction of the residual width D removed "
        "(d = floor((1 - sparsity) * D), rounded down to `round_to`), not of parameters; the real "
        "parameter fraction is reported as the `param_fraction_removed` result.",
        examples=[0.25],
    )
    round_to: int = Field(8, ge=1, le=128, description="Round the kept width d down to a multiple of this.")
    calibration: CalibrationSpec = Field(default_factory=CalibrationSpec)
    perplexity: PerplexitySpec = Field(
        default_factory=PerplexitySpec,
        description="How the dense and pruned models are scored; the dense baseline is reused "
        "from an earlier job when model, data and this protocol match.",
    )
    save_artifact: bool = Field(
        True, description="Save the pruned model under the artifact directory (see `/artifacts`)."
    )
    slice_head: bool | None = Field(
        None,
        description="Also slice the LM head's input. null: the family's default (no, except GPT-2, "
        "whose forward needs it).",
    )


JobCreate = Annotated[EvaluateJobCreate | PruneJobCreate, Field(discriminator="kind")]
JOB_KINDS = ("evaluate", "prune")


class JobLinks(BaseModel):
    self: str
    wait: str
    results: str
    artifacts: str


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


class ArtifactPublic(BaseModel):
    """A file or folder a job wrote (e.g. a sliced model), on the artifact volume."""

    id: int
    job_id: str
    kind: str = Field(description="`sliced-model`: load it with `workers.slicing.artifacts.load_sliced`.")
    path: str = Field(description="Folder on the artifact volume (PRUNECAST_ARTIFACT_DIR).")
    bytes: int = Field(description="Total size of the files in the folder.")
    sha256: str = Field(description="SHA-256 of the weights file (model.safetensors).")
    created_at: datetime


class ArtifactList(BaseModel):
    items: list[ArtifactPublic]


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    checks: dict[str, str] = Field(default_factory=dict)
