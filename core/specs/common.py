"""What every job request is made of: the model, the measuring protocols, the calibration text.

Request models forbid unknown fields, so a typo is a 422 that names the field rather than a
silently ignored option, and refuse text the store cannot hold (`core.text`). The science behind
each protocol is in docs/science.md.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from core.prediction.paired_docs import DEFAULT_DOC_PRECISION
from core.prediction.paired_windows import DEFAULT_PRECISION
from core.text import invalid_strings

Dtype = Literal["auto", "float32", "bfloat16", "float16"]
Device = Literal["auto", "cpu", "cuda"]


class StrictModel(BaseModel):
    """A request body: unknown fields and unstorable characters are refused."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _storable_text(cls, data: Any) -> Any:
        for where, problem in invalid_strings(data):
            raise ValueError(f"`{where}` contains {problem}, which the store cannot hold")
        return data


PRECISION_DESCRIPTION = (
    "Stop scoring windows when the 95 % band on PPL is within this relative half width (0.02: ±2 %): "
    "windows are added in a seeded order, a few at a time, and a pruned or simulated model is paired "
    "with the dense model's own per-window NLL, so the band covers the full-window value "
    "(docs/science.md §4). null: every window (the full-window value itself)."
)
DOC_PRECISION_DESCRIPTION = (
    "Stop scoring a task's docs when the 95 % band on each score is within this half width, in "
    "accuracy (0.02: ±2 points): docs are added in a seeded order, a few at a time, paired with the "
    "dense model's right-or-wrong record on every doc, so the band covers the every-doc score "
    "(docs/science.md §4). Multiple choice and GSM8K pair; LAMBADA (its perplexity is not right or "
    "wrong per doc) scores every doc. null: every doc."
)


class PerplexitySpec(StrictModel):
    """Token perplexity on a test split, non-overlapping windows (docs/science.md §4)."""

    dataset: Literal["wikitext2"] = Field("wikitext2", description="Evaluation corpus (test split).")
    seqlen: int = Field(
        2048, ge=16, le=131_072, description="Window length in tokens; capped at the model's context."
    )
    max_windows: int | None = Field(
        None, ge=1, le=100_000, description="Score only the first N windows (cheap runs); null = all."
    )
    batch_size: int = Field(1, ge=1, le=64, description="Windows per forward pass.")
    precision: float | None = Field(
        None,
        gt=0.0,
        lt=1.0,
        description=PRECISION_DESCRIPTION + " Measured jobs default to null: a CI gate compares "
        "full-window numbers unless it asks for a band.",
    )


class SimulatedPerplexitySpec(PerplexitySpec):
    """A simulation's windows: the same protocol, scored to the default precision unless asked."""

    precision: float | None = Field(
        DEFAULT_PRECISION,
        gt=0.0,
        lt=1.0,
        description=PRECISION_DESCRIPTION
        + f" Simulations default to {DEFAULT_PRECISION:g}: the cheap answer. A simulated curve of three or "
        "more points pairs them with its middle point instead, scored on every window, where its pilot "
        "says that needs fewer windows (slicing).",
    )


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
    offload: Literal["auto", "always", "never"] = Field(
        "auto",
        description="`auto`: keep the model whole on the device when it takes at most 80 % of the device's "
        "memory budget (free CUDA memory, or PRUNECAST_DEVICE_MEMORY_BYTES), else keep it in CPU memory and "
        "stream its blocks through the device one at a time, with the same numbers; `always` / `never` force "
        "either. The plan is recorded as `memory_plan` in every result's protocol.",
    )
    seed: int = Field(42, ge=0, le=2**31 - 1, description="Seed for any sampling the job does.")


# Tasks, named as lm-evaluation-harness names them (core.tasks.TASK_CATALOGUE and the workers'
# registries; a test checks they agree). Spelled out as a Literal so that /docs lists them.
AccuracyTask = Literal[
    "arc_easy",
    "arc_challenge",
    "piqa",
    "hellaswag",
    "winogrande",
    "boolq",
    "openbookqa",
    "lambada_openai",
    "gsm8k",
]
ACCURACY_TASKS: tuple[str, ...] = get_args(AccuracyTask)


class AccuracySpec(StrictModel):
    """Task scores by the lm-evaluation-harness protocols (docs/science.md §4): multiple-choice
    `acc` / `acc_norm`, LAMBADA's greedy last-word `acc` and `perplexity`, GSM8K's greedy-generation
    `exact_match` under its `strict-match` and `flexible-extract` filters; each with its standard
    error, per task."""

    tasks: list[AccuracyTask] = Field(
        min_length=1,
        max_length=len(ACCURACY_TASKS),
        description="Tasks to score, each once. Each scores lm-eval's default split (ARC, OpenBookQA, "
        "LAMBADA and GSM8K: test; the others: validation). `lambada_openai` and `gsm8k` are generative: "
        "the model's own greedy decoding decides them.",
        examples=[["arc_easy", "winogrande"]],
    )
    limit: int | None = Field(
        None, ge=1, le=100_000, description="Score only N docs per task (cheap runs); null = all."
    )
    subsample_seed: int | None = Field(
        None,
        ge=0,
        le=2**31 - 1,
        description="With `limit`: N seeded random docs instead of the first N; null = the first N.",
    )
    num_fewshot: int | None = Field(
        None,
        ge=0,
        le=25,
        description="Solved examples before each question (drawn from the same split, never the "
        "scored doc); null = each task's lm-eval default (5 for gsm8k, 0 for the others).",
    )
    max_new_tokens: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="Token limit of each generation (gsm8k); null = lm-eval's default (256). "
        "Generation also stops at the task's stop sequences and at end-of-sequence.",
    )
    batch_size: int = Field(
        16, ge=1, le=512, description="Options scored, or prompts generated, per forward pass."
    )
    precision: float | None = Field(
        None,
        gt=0.0,
        lt=1.0,
        description=DOC_PRECISION_DESCRIPTION + " Measured jobs default to null: a CI gate compares "
        "every-doc scores unless it asks for a band.",
    )

    @field_validator("tasks")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("tasks lists the same task twice")
        return value


class SimulatedAccuracySpec(AccuracySpec):
    """A simulation's tasks: the same protocol, scored to the default precision unless asked."""

    precision: float | None = Field(
        DEFAULT_DOC_PRECISION,
        gt=0.0,
        lt=1.0,
        description=DOC_PRECISION_DESCRIPTION
        + f" Simulations default to {DEFAULT_DOC_PRECISION:g}: the cheap answer.",
    )


# Longest calibration text a request may carry (characters). The request body limit
# (PRUNECAST_MAX_BODY_BYTES) applies first, so raise that too to send texts this long.
MAX_CALIBRATION_TEXT_CHARS = 2_000_000


class CalibrationSpec(StrictModel):
    """The text SliceGPT's PCAs are computed on: `num_sequences` windows of `seqlen` tokens drawn
    at seeded random offsets from one corpus (docs/science.md §1, step 7)."""

    corpus: Literal["boolq-passages", "lambada-passages", "text"] = Field(
        "boolq-passages",
        description="`boolq-passages`: the packaged BoolQ Wikipedia passages (English prose, ~1.6M "
        "characters; never the evaluation split). `lambada-passages`: the packaged LAMBADA passages "
        "(novels, ~1.7M characters: LAMBADA's test split, so do not calibrate on it a model you then "
        "score on LAMBADA). `text`: the `text` field of this request.",
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
