"""GET /v1/models/{model}/retention: what each pruning of a model keeps of its multiple-choice
accuracy, its generative accuracy and its perplexity (`core.retention`), with the probes' view."""

from __future__ import annotations

from pydantic import BaseModel, Field

from app.schemas.base import ModelId


class RetainedScorePublic(BaseModel):
    family: str = Field(description="`multiple_choice`, `generative` or `perplexity`.")
    dataset: str = Field(description="The task, or the perplexity corpus.")
    metric: str
    dense: float
    pruned: float
    retained: float = Field(description="pruned / dense for scores, dense / pruned for perplexities.")
    stderr: float | None = Field(description="Delta method, the two treated as independent (an upper bound).")
    n: int | None
    result_id: int
    dense_result_id: int


class FamilyMeanPublic(BaseModel):
    family: str
    retained: float = Field(description="Mean retained score over the family's tasks.")
    stderr: float | None
    tasks: list[str]


class ProbeReadingPublic(BaseModel):
    """What a `probe` job of the same pruning measured (the newest one), where there is one."""

    job_id: str
    final_kl: float | None = Field(
        description="Mean KL(dense || pruned) of the next-token distribution on the prompts."
    )
    greedy_prefix_agree: float | None = Field(
        description="Share of prompts whose greedy generations agree at every step, at the last step probed."
    )
    steps: int | None = Field(description="Generation steps the probe ran.")


class PruningRetentionPublic(BaseModel):
    method: str
    sparsity: float
    verdict: str
    means: list[FamilyMeanPublic]
    scores: list[RetainedScorePublic]
    skipped: list[str] = Field(description="Paired results left out, and why.")
    probe: ProbeReadingPublic | None = None


class RetentionPublic(BaseModel):
    model: ModelId
    prunings: list[PruningRetentionPublic]
    notes: list[str]
