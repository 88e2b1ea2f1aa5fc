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
    """What a `probe` job of the same pruning measured (the newest one of its convention)."""

    job_id: str
    convention: str = Field("prunecast", description="The rules the probe read its numbers by.")
    temperature: float | None = Field(None, description="T of p = softmax(z / T) in that job.")
    final_kl: float | None = Field(
        description="Mean KL(dense || pruned) of the next-token distribution on the prompts, at T."
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
    probe: ProbeReadingPublic | None = Field(
        None, description="The newest `prunecast`-convention probe of this pruning, where there is one."
    )
    probes: list[ProbeReadingPublic] = Field(
        default_factory=list,
        description="The newest probe of this pruning under each convention, never pooled across them.",
    )


class RetentionPublic(BaseModel):
    model: ModelId
    prunings: list[PruningRetentionPublic]
    notes: list[str]
