"""A task scored on a few docs paired with the dense model's right-or-wrong record on every doc, to a
precision (`core.prediction.paired_docs`; docs/science.md §4, "Task scores to a precision").

The dense model's record is stored once with its score (`doc_record`, on the dense rows). A pruned
or simulated model then scores docs in a seeded order, a few at a time, through the task's own scorer
(`task_scoring.SCORERS`), until the paired band on every metric reaches the precision. Only tasks
whose every metric is right or wrong per doc pair: multiple choice (`acc`, `acc_norm`) and GSM8K's
exact matches. LAMBADA's `perplexity` is not, so LAMBADA is scored on every doc.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from core.prediction.paired_docs import DocEstimate, score_to_precision
from core.tasks import task_info
from workers.evaluation.generative import GenerativeResult
from workers.evaluation.multiple_choice import TaskResult
from workers.evaluation.task_data import chance_level, docs_sha256
from workers.evaluation.task_scoring import SCORERS, ScoredTask, TaskRequest, docs_to_score

SUMMED = ("requests", "forward_passes", "shared_contexts", "truncated_requests", "truncated_prompts")
"""Protocol counters that add up over the batches of docs a paired score was scored in."""


def doc_record(result: ScoredTask) -> dict[str, list[int]] | None:
    """Each metric's right (1) or wrong (0) on each doc, in the order scored; None unless every metric
    of the task is right or wrong per doc."""
    if isinstance(result, TaskResult):
        record = {"acc": [int(doc.acc) for doc in result.doc_scores]}
        norms = [doc.acc_norm for doc in result.doc_scores]
        if result.acc_norm is not None and all(norm is not None for norm in norms):
            record["acc_norm"] = [int(norm) for norm in norms if norm is not None]
    elif isinstance(result, GenerativeResult) and set(result.values) <= set(result.per_doc):
        record = {metric: [int(right) for right in result.per_doc[metric]] for metric in result.values}
    else:
        return None
    if set(record) != set(result.metric_values()):
        return None
    binary = all(
        right == scored
        for metric, rights in record.items()
        for right, scored in zip(rights, _raw_scores(result, metric), strict=True)
    )
    return record if binary else None


def _raw_scores(result: ScoredTask, metric: str) -> Sequence[float | None]:
    if isinstance(result, TaskResult):
        return [getattr(doc, metric) for doc in result.doc_scores]
    assert isinstance(result, GenerativeResult)
    return result.per_doc[metric]


@dataclass(frozen=True)
class PairedTaskScore:
    """A task's scores over all its docs estimated from `docs` of them (a `ScoredTask`): each
    metric's stderr adds the paired band's to lm-eval's sampling error of the full-doc score."""

    task: str
    n: int  # docs scored
    chance: float
    split: str
    data_sha256: str  # of every doc of the protocol: the score stands for all of them
    elapsed_s: float
    protocol: dict[str, Any]
    estimates: dict[str, DocEstimate] = field(default_factory=dict)

    def metric_values(self) -> dict[str, tuple[float, float | None]]:
        return {metric: (e.value, _stderr(e)) for metric, e in self.estimates.items()}


def _stderr(estimate: DocEstimate) -> float | None:
    """lm-eval's standard error of the full-doc score (p (1 - p) / (N - 1)) and the paired band's,
    added in quadrature: with every doc scored it is lm-eval's own."""
    population = estimate.of_docs
    if population < 2:
        return None
    p = estimate.value
    return math.sqrt(p * (1 - p) / (population - 1) + estimate.stderr**2)


def pairs(request: TaskRequest) -> bool:
    """Whether the task's metrics are right-or-wrong per doc, so its docs can be paired."""
    return task_info(request.name).output_type != "loglikelihood"


def score_paired(
    model: torch.nn.Module,
    tokenizer: Any,
    request: TaskRequest,
    dense: Mapping[str, Sequence[int]],
    precision: float,
    order_seed: int,
    *,
    on_look: Callable[[dict[str, DocEstimate]], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> PairedTaskScore:
    """Score `request`'s docs in the seeded order until every metric's band half width is at most
    `precision`, paired with `dense` (metric -> the dense model's 0 or 1 on every doc)."""
    started = time.perf_counter()
    split, docs = docs_to_score(request)
    if any(len(rights) != len(docs) for rights in dense.values()):
        raise ValueError(f"{request.name}: the dense record does not cover the {len(docs)} docs scored")
    scorer = SCORERS[task_info(request.name).output_type]
    batches: list[ScoredTask] = []
    rights: dict[str, list[int]] = {metric: [] for metric in dense}  # in the order scored

    def score(indices: list[int]) -> dict[str, list[float]]:
        found = scorer(model, tokenizer, request, split, [docs[i] for i in indices], should_stop=should_stop)
        batches.append(found)
        record = doc_record(found)
        if record is None or set(record) != set(dense):
            raise ValueError(f"{request.name}: its metrics are not right-or-wrong per doc")
        for metric, found_rights in record.items():
            rights[metric] += found_rights
        return {metric: [float(right) for right in rights] for metric, rights in record.items()}

    estimates = score_to_precision(score, dense, precision, order_seed, on_look=on_look)
    protocol = dict(batches[0].protocol)
    for key in SUMMED:
        if isinstance(protocol.get(key), int):
            protocol[key] = sum(int(batch.protocol.get(key) or 0) for batch in batches)
    protocol["paired_docs"] = {  # the docs scored are the first `docs` of doc_order(of_docs, order_seed)
        metric: {**e.to_dict(precision, order_seed), "doc_scores": rights[metric]}
        for metric, e in estimates.items()
    }
    return PairedTaskScore(
        task=batches[0].task,
        n=next(iter(estimates.values())).docs,
        chance=chance_level(docs) if isinstance(batches[0], TaskResult) else batches[0].chance,
        split=batches[0].split,
        data_sha256=docs_sha256(docs),
        elapsed_s=time.perf_counter() - started,
        protocol=protocol,
        estimates=estimates,
    )
