"""What a job's steps hand on to the next and to the rows they store: the evaluation data, the task
plans and dense scores, the prepared dense model and each pruned model as scored.

The lowest room of `workers.kinds`: the steps (`steps`, `accuracy_steps`, `prune_steps`) make these
and the row builders (`rows`) read them, so both import this module and it imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from core.model_sources import ModelSource
from core.specs.common import PerplexitySpec
from core.specs.jobs import PruneJobCreate, SweepJobCreate
from core.tables import Result
from workers.calibration import CalibrationBatch
from workers.data import TextCorpus
from workers.evaluation.perplexity import PerplexityResult
from workers.loading import LoadedModel
from workers.pruners import Report

PruningJob = PruneJobCreate | SweepJobCreate


@dataclass(frozen=True)
class PerplexityData:
    """The evaluation tokens of a job and the protocol every perplexity of the job is measured with."""

    spec: PerplexitySpec
    corpus: TextCorpus
    token_ids: torch.Tensor  # (tokens,)
    seqlen: int  # spec.seqlen capped at the model's context
    match: dict[str, Any]  # steps.BASELINE_MATCH_KEYS -> value: what a reusable dense baseline must share


@dataclass(frozen=True)
class TaskPlan:
    """One task of a job, its data checked before any scoring."""

    name: str
    split: str
    metrics: tuple[str, ...]  # the task's metrics (core.tasks)
    match: dict[str, Any]  # accuracy_steps.ACCURACY_MATCH_KEYS -> value a reused dense accuracy shares


@dataclass(frozen=True)
class DenseAccuracy:
    """The dense accuracy of one task: metric -> result, and whether another job measured it."""

    results: dict[str, Result]
    reused: bool


@dataclass
class Prepared:
    """What every sparsity of a slicing job is sliced and scored with, measured or drawn once."""

    source: ModelSource
    loaded: LoadedModel  # the dense model (the first sparsity may slice it in place) and tokenizer
    environment: dict[str, Any]
    data: PerplexityData
    dense: Result
    dense_reused: bool  # measured by another job
    calibration: CalibrationBatch | None  # None for data-free methods (magnitude)
    calibration_record: dict[str, Any] | None
    timings: dict[str, float] = field(default_factory=dict)
    accuracy_plans: list[TaskPlan] = field(default_factory=list)  # empty: no accuracy asked
    dense_accuracy: dict[str, DenseAccuracy] = field(default_factory=dict)  # task -> its dense rows


@dataclass(frozen=True)
class Measured:
    """One sliced model, scored."""

    sparsity: float
    report: Report
    perplexity: PerplexityResult
    artifact_path: str | None
    timings: dict[str, float]
