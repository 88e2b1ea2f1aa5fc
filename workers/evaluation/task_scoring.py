"""One entry point for scoring any task a job names, dispatched by its lm-eval `output_type`
(`core.tasks`): multiple choice (`workers.evaluation.multiple_choice`), a target's log-likelihood
and greedy match, or greedy generation (`workers.evaluation.generative`). Jobs see one result
type: anything with
`metric_values()`, the docs scored (`n`, `chance`, `data_sha256`) and a `protocol`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from core.tasks import OutputType, task_info
from workers.evaluation.generative import score_generation_task, score_target_task
from workers.evaluation.generative_tasks import load_generative_task
from workers.evaluation.mc_formats import load_task
from workers.evaluation.multiple_choice import score_selected
from workers.evaluation.task_data import DocSplit, fewshot_docs

# Seed of the few-shot draws a job scores with (lm-eval's default fewshot seed); recorded in the protocol.
FEWSHOT_SEED = 1234


class ScoredTask(Protocol):
    """What a job stores of one scored task."""

    @property
    def task(self) -> str: ...

    @property
    def n(self) -> int: ...

    @property
    def chance(self) -> float: ...

    @property
    def split(self) -> str: ...

    @property
    def data_sha256(self) -> str: ...

    @property
    def elapsed_s(self) -> float: ...

    @property
    def protocol(self) -> dict[str, Any]: ...

    def metric_values(self) -> dict[str, tuple[float, float | None]]: ...


@dataclass(frozen=True)
class TaskRequest:
    """How one task is to be scored, every default resolved (what a dense result must share)."""

    name: str
    limit: int | None
    subsample_seed: int | None
    num_fewshot: int
    max_new_tokens: int | None  # generate_until tasks only
    batch_size: int
    fewshot_seed: int


def task_request(
    name: str,
    *,
    limit: int | None,
    subsample_seed: int | None,
    num_fewshot: int | None,
    max_new_tokens: int | None,
    batch_size: int,
    fewshot_seed: int,
) -> TaskRequest:
    """The request with the task's lm-eval defaults filled in (few-shot count, generation limit)."""
    info = task_info(name)
    return TaskRequest(
        name=name,
        limit=limit,
        subsample_seed=subsample_seed,
        num_fewshot=info.default_fewshot if num_fewshot is None else num_fewshot,
        max_new_tokens=(max_new_tokens or info.max_new_tokens)
        if info.output_type == "generate_until"
        else None,
        batch_size=batch_size,
        fewshot_seed=fewshot_seed,
    )


def load_split(name: str) -> DocSplit:
    """The default split of any task, multiple choice or generative."""
    return load_task(name) if task_info(name).output_type == "multiple_choice" else load_generative_task(name)


def docs_to_score(request: TaskRequest) -> tuple[DocSplit, list[Any]]:
    """(the split, the docs as they will be scored: selected, few-shot examples in their prompts).
    Raises the loaders' errors (ValueError, DataMissingError, TaskDataError)."""
    split = load_split(request.name)
    indices = split.select(limit=request.limit, subsample_seed=request.subsample_seed)
    return split, fewshot_docs(split, indices, request.num_fewshot, request.fewshot_seed)


Scorer = Callable[..., ScoredTask]


def _shared(request: TaskRequest) -> dict[str, Any]:
    """The arguments every scorer takes from the request."""
    return {
        "limit": request.limit,
        "subsample_seed": request.subsample_seed,
        "num_fewshot": request.num_fewshot,
        "fewshot_seed": request.fewshot_seed,
        "batch_size": request.batch_size,
    }


def _score_multiple_choice(
    model: torch.nn.Module,
    tokenizer: Any,
    request: TaskRequest,
    split: Any,
    docs: Sequence[Any],
    **hooks: Any,
) -> ScoredTask:
    return score_selected(model, tokenizer, split, docs, **_shared(request), **hooks)


def _score_target(
    model: torch.nn.Module,
    tokenizer: Any,
    request: TaskRequest,
    split: Any,
    docs: Sequence[Any],
    **hooks: Any,
) -> ScoredTask:
    return score_target_task(model, tokenizer, split, docs, **_shared(request), **hooks)


def _score_generation(
    model: torch.nn.Module,
    tokenizer: Any,
    request: TaskRequest,
    split: Any,
    docs: Sequence[Any],
    **hooks: Any,
) -> ScoredTask:
    return score_generation_task(
        model, tokenizer, split, docs, max_new_tokens=request.max_new_tokens, **_shared(request), **hooks
    )


SCORERS: dict[OutputType, Scorer] = {
    "multiple_choice": _score_multiple_choice,
    "loglikelihood": _score_target,
    "generate_until": _score_generation,
}


def score_requested_task(
    model: torch.nn.Module,
    tokenizer: Any,
    request: TaskRequest,
    *,
    progress: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> ScoredTask:
    """Score one task as requested; `progress(done, total)` counts options, targets or prompts."""
    split, docs = docs_to_score(request)
    scorer = SCORERS[task_info(request.name).output_type]
    return scorer(model, tokenizer, request, split, docs, progress=progress, should_stop=should_stop)
