"""When pruning works: for each pruning of a model (method x sparsity), how much of the dense model's
multiple-choice accuracy, generative accuracy and perplexity it keeps (docs/science.md §4).

Retained = pruned / dense for scores, dense / pruned for perplexities, so 1 is "unchanged" and less
is worse in every column. A pruned result is paired with the dense result it was measured against
(its protocol's `dense_result_id`, which every prune and sweep job records), never with another
protocol's. Each task counts by its headline metric (`core.tasks.TaskInfo.headline`). The stderr of a
ratio combines both stderrs as if independent (delta method); the two share their docs, so it is an
upper bound. The verdict compares the mean retained generative and multiple-choice scores: generation
"breaks first" when it keeps less by more than twice their combined stderr.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from core.tasks import TASK_CATALOGUE

Family = Literal["multiple_choice", "generative", "perplexity"]
PERPLEXITY_METRIC = "ppl"
VERDICT_MARGIN_SD = 2.0


class ResultLike(Protocol):
    """The fields of a stored result this module reads (a `core.tables.Result` or its public form)."""

    @property
    def id(self) -> int: ...

    @property
    def method(self) -> str: ...

    @property
    def sparsity(self) -> float: ...

    @property
    def metric(self) -> str: ...

    @property
    def dataset(self) -> str: ...

    @property
    def value(self) -> float: ...

    @property
    def stderr(self) -> float | None: ...

    @property
    def n(self) -> int | None: ...

    @property
    def protocol(self) -> dict[str, object]: ...


@dataclass(frozen=True)
class RetainedScore:
    """One task (or perplexity corpus) of one pruning against its dense result."""

    family: Family
    dataset: str
    metric: str
    dense: float
    pruned: float
    retained: float
    stderr: float | None
    n: int | None
    result_id: int
    dense_result_id: int


@dataclass(frozen=True)
class FamilyMean:
    """The mean retained score of one family over its tasks, with the stderr of that mean."""

    family: Family
    retained: float
    stderr: float | None
    tasks: tuple[str, ...]


@dataclass(frozen=True)
class PruningRetention:
    """Everything one pruning keeps, and what that says."""

    method: str
    sparsity: float
    scores: tuple[RetainedScore, ...]
    means: dict[Family, FamilyMean] = field(default_factory=dict)
    verdict: str = ""
    skipped: tuple[str, ...] = ()  # why a paired result was left out (dense at its floor, ...)


def _family(dataset: str, metric: str) -> Family | None:
    if metric == PERPLEXITY_METRIC:
        return "perplexity"
    info = TASK_CATALOGUE.get(dataset)
    if info is None:
        return None
    if metric == info.headline:
        return "generative" if info.generative else "multiple_choice"
    if metric in info.lower_is_better:
        return "perplexity"
    return None


def _ratio_stderr(top: float, top_se: float | None, bottom: float, bottom_se: float | None) -> float | None:
    if top_se is None or bottom_se is None or top == 0.0:
        return None
    ratio = top / bottom
    return abs(ratio) * math.hypot(top_se / top, bottom_se / bottom)


def _retained(row: ResultLike, dense: ResultLike, family: Family) -> RetainedScore | str:
    what = f"{row.dataset} {row.metric}"
    if family == "perplexity":
        if row.value <= 0.0 or not math.isfinite(row.value):
            return f"{what}: pruned perplexity {row.value} is not a positive number"
        top, top_se, bottom, bottom_se = dense.value, dense.stderr, row.value, row.stderr
    else:
        if dense.value <= 0.0:
            return f"{what}: the dense model scores 0, at the task's floor: no skill to lose"
        top, top_se, bottom, bottom_se = row.value, row.stderr, dense.value, dense.stderr
    return RetainedScore(
        family=family,
        dataset=row.dataset,
        metric=row.metric,
        dense=dense.value,
        pruned=row.value,
        retained=top / bottom,
        stderr=_ratio_stderr(top, top_se, bottom, bottom_se),
        n=row.n,
        result_id=row.id,
        dense_result_id=dense.id,
    )


def _mean(family: Family, scores: Sequence[RetainedScore]) -> FamilyMean:
    errors = [score.stderr for score in scores]
    stderr = (
        None
        if any(error is None for error in errors)
        else math.sqrt(sum(error * error for error in errors if error is not None)) / len(scores)
    )
    return FamilyMean(
        family=family,
        retained=sum(score.retained for score in scores) / len(scores),
        stderr=stderr,
        tasks=tuple(score.dataset for score in scores),
    )


def verdict(means: dict[Family, FamilyMean]) -> str:
    """One sentence: does generation degrade more than multiple choice here?"""
    choice, generative = means.get("multiple_choice"), means.get("generative")
    if choice is None or generative is None:
        missing = "generative" if generative is None else "multiple-choice"
        return f"no {missing} task was measured for this pruning: score both to compare them"
    gap = choice.retained - generative.retained
    spread = (
        None
        if choice.stderr is None or generative.stderr is None
        else math.hypot(choice.stderr, generative.stderr)
    )
    keeps = (
        f"multiple choice keeps {choice.retained:.0%}, generation {generative.retained:.0%} "
        "of the dense score"
    )
    if spread is None:
        return f"{keeps}; no stderr to judge the gap"
    if gap > VERDICT_MARGIN_SD * spread:
        return f"generation breaks first: {keeps} (gap {gap:.2f} > {VERDICT_MARGIN_SD:g} x {spread:.2f})"
    if -gap > VERDICT_MARGIN_SD * spread:
        return (
            f"multiple choice breaks first: {keeps} (gap {-gap:.2f} > {VERDICT_MARGIN_SD:g} x {spread:.2f})"
        )
    return f"no clear difference: {keeps} (gap {gap:+.2f} within {VERDICT_MARGIN_SD:g} x {spread:.2f})"


def retention(rows: Iterable[ResultLike], dense_rows: Iterable[ResultLike]) -> list[PruningRetention]:
    """Per (method, sparsity) of the pruned `rows`, in that order, the retained scores against the
    dense result each names (found among `dense_rows` by id)."""
    dense = {row.id: row for row in dense_rows}
    grouped: dict[tuple[str, float], list[RetainedScore]] = {}
    skipped: dict[tuple[str, float], list[str]] = {}
    seen: set[tuple[str, float, str, str]] = set()
    for row in sorted(rows, key=lambda r: -r.id):  # newest first: it wins a repeated measurement
        family = _family(row.dataset, row.metric)
        dense_id = row.protocol.get("dense_result_id")
        key = (row.method, row.sparsity)
        if family is None or not isinstance(dense_id, int) or dense_id not in dense:
            continue
        if (row.method, row.sparsity, row.dataset, row.metric) in seen:
            continue
        seen.add((row.method, row.sparsity, row.dataset, row.metric))
        outcome = _retained(row, dense[dense_id], family)
        if isinstance(outcome, str):
            skipped.setdefault(key, []).append(outcome)
        else:
            grouped.setdefault(key, []).append(outcome)
    answers = []
    for key in sorted(set(grouped) | set(skipped)):
        scores = sorted(grouped.get(key, []), key=lambda s: (s.family, s.dataset, s.metric))
        families: dict[Family, list[RetainedScore]] = {}
        for score in scores:
            families.setdefault(score.family, []).append(score)
        means = {family: _mean(family, members) for family, members in families.items()}
        answers.append(
            PruningRetention(
                method=key[0],
                sparsity=key[1],
                scores=tuple(scores),
                means=means,
                verdict=verdict(means),
                skipped=tuple(sorted(skipped.get(key, []))),
            )
        )
    return answers
