"""Multiple-choice accuracy by the lm-evaluation-harness log-likelihood protocol.

Each option is a continuation of its context; its score is the summed log-likelihood of the
continuation tokens (`workers.evaluation.loglikelihood`). acc = argmax of the scores, acc_norm =
argmax of score / characters of the option text, and WinoGrande (partial scoring) scores the shared
suffix after each option-filled prefix, acc only. Standard errors are lm-eval's: sample standard
deviation / sqrt(n).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from workers.evaluation.loglikelihood import (
    DEFAULT_BATCH_SIZE,
    ScoredRequests,
    encode_requests,
    score_encoded,
)
from workers.evaluation.mc_formats import load_task
from workers.evaluation.model_facts import context_length, mean_stderr, runtime_protocol, wants_bos
from workers.evaluation.task_data import (
    FEWSHOT_DELIMITER,
    MCDoc,
    MCTask,
    chance_level,
    docs_sha256,
    fewshot_docs,
    task_data_version,
)


@dataclass(frozen=True)
class DocScore:
    """The scores of one doc's options and what they picked."""

    doc_id: str
    gold: int
    loglikelihoods: tuple[float, ...]  # summed log-likelihood of each option's continuation
    acc: float  # 1.0 when argmax(loglikelihoods) == gold
    acc_norm: float | None  # 1.0 when argmax(loglikelihood / characters) == gold; None if partial


@dataclass(frozen=True)
class TaskResult:
    """One task's metrics with everything needed to reproduce or compare them."""

    task: str
    acc: float
    acc_stderr: float | None  # None when n < 2
    acc_norm: float | None  # None where lm-eval does not define it (partial scoring)
    acc_norm_stderr: float | None
    n: int  # docs scored
    chance: float  # mean of 1/options over the docs scored
    split: str
    data_sha256: str  # sha256 of the docs as scored (few-shot prompts included)
    elapsed_s: float
    protocol: dict[str, Any]
    doc_scores: tuple[DocScore, ...] = ()

    def metric_values(self) -> dict[str, tuple[float, float | None]]:
        """Each metric the task defines -> (value, stderr), as stored."""
        values = {"acc": (self.acc, self.acc_stderr)}
        if self.acc_norm is not None:
            values["acc_norm"] = (self.acc_norm, self.acc_norm_stderr)
        return values

    def metrics(self) -> dict[str, float]:
        """lm-eval metric names to values, only those defined."""
        values = {
            "acc": self.acc,
            "acc_stderr": self.acc_stderr,
            "acc_norm": self.acc_norm,
            "acc_norm_stderr": self.acc_norm_stderr,
        }
        return {name: value for name, value in values.items() if value is not None}

    def to_json(self, *, include_docs: bool = False) -> dict[str, Any]:
        payload = asdict(self)
        if not include_docs:
            payload.pop("doc_scores")
        return payload


def doc_score(doc: MCDoc, lls: Sequence[float]) -> DocScore:
    """acc (argmax LL) and acc_norm (argmax LL / characters of the option) of one doc."""
    if len(lls) != doc.num_choices:
        raise ValueError(f"doc {doc.doc_id}: {doc.num_choices} options but {len(lls)} scores")
    pick = _argmax(lls)
    acc_norm = None
    if not doc.partial:
        pick_norm = _argmax([ll / len(choice) for ll, choice in zip(lls, doc.choices, strict=True)])
        acc_norm = float(pick_norm == doc.gold)
    return DocScore(
        doc_id=doc.doc_id,
        gold=doc.gold,
        loglikelihoods=tuple(lls),
        acc=float(pick == doc.gold),
        acc_norm=acc_norm,
    )


def score_docs(
    model: torch.nn.Module,
    tokenizer: Any,
    docs: Sequence[MCDoc],
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    share_context: bool = True,
    add_bos: bool | None = None,
    progress: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> tuple[list[DocScore], ScoredRequests]:
    """Score every option of every doc in shared batches; one DocScore per doc, in order."""
    requests = [request for doc in docs for request in doc.requests()]
    encoded = encode_requests(model, tokenizer, requests, add_bos=add_bos)
    scored = score_encoded(
        model,
        encoded,
        batch_size=batch_size,
        share_context=share_context,
        progress=progress,
        should_stop=should_stop,
    )
    results, cursor = [], 0
    for doc in docs:
        results.append(doc_score(doc, scored.loglikelihoods[cursor : cursor + doc.num_choices]))
        cursor += doc.num_choices
    return results, scored


def score_task(
    model: torch.nn.Module,
    tokenizer: Any,
    task: str | MCTask,
    *,
    split: str | None = None,
    limit: int | None = None,
    subsample_seed: int | None = None,
    num_fewshot: int = 0,
    fewshot_seed: int = 1234,
    batch_size: int = DEFAULT_BATCH_SIZE,
    share_context: bool = True,
    add_bos: bool | None = None,
    progress: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> TaskResult:
    """acc / acc_norm with stderr of `model` on a task (a registered name or a loaded MCTask).

    `limit` takes the first docs, or `limit` seeded random docs with `subsample_seed`.
    `num_fewshot` examples come from the same split (see `task_data.fewshot_docs`).
    `progress(done, total)` counts scored options; `should_stop()` is polled before each batch
    and ends the run with EvaluationStopped.
    """
    started = time.perf_counter()
    loaded = load_task(task, split=split) if isinstance(task, str) else task
    if split is not None and loaded.split != split:
        raise ValueError(f"task {loaded.name!r} was loaded with split {loaded.split!r}, not {split!r}")
    indices = loaded.select(limit=limit, subsample_seed=subsample_seed)
    docs = fewshot_docs(loaded, indices, num_fewshot, fewshot_seed)
    return score_selected(
        model,
        tokenizer,
        loaded,
        docs,
        limit=limit,
        subsample_seed=subsample_seed,
        num_fewshot=num_fewshot,
        fewshot_seed=fewshot_seed,
        batch_size=batch_size,
        share_context=share_context,
        add_bos=add_bos,
        progress=progress,
        should_stop=should_stop,
        started=started,
    )


def score_selected(
    model: torch.nn.Module,
    tokenizer: Any,
    loaded: MCTask,
    docs: Sequence[MCDoc],
    *,
    limit: int | None,
    subsample_seed: int | None,
    num_fewshot: int,
    fewshot_seed: int,
    batch_size: int = DEFAULT_BATCH_SIZE,
    share_context: bool = True,
    add_bos: bool | None = None,
    progress: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    started: float | None = None,
) -> TaskResult:
    """`score_task` on docs already selected (few-shot prompts in them): what a job scoring a
    subset of a task's docs calls (`workers.evaluation.paired_tasks`)."""
    started = time.perf_counter() if started is None else started
    scores, scored = score_docs(
        model,
        tokenizer,
        docs,
        batch_size=batch_size,
        share_context=share_context,
        add_bos=add_bos,
        progress=progress,
        should_stop=should_stop,
    )
    accs = [score.acc for score in scores]
    norms = [score.acc_norm for score in scores if score.acc_norm is not None]
    has_norm = "acc_norm" in loaded.metrics and len(norms) == len(scores)
    protocol: dict[str, Any] = {
        "harness": "lm-evaluation-harness (multiple_choice, loglikelihood)",
        "scoring": "partial" if any(doc.partial for doc in docs) else "full",
        "acc_norm": "loglikelihood / characters of the option" if has_norm else None,
        "num_fewshot": num_fewshot,
        "fewshot_seed": fewshot_seed if num_fewshot else None,
        "fewshot_source": f"{loaded.split} split, excluding the scored doc" if num_fewshot else None,
        "fewshot_delimiter": FEWSHOT_DELIMITER,
        "target_delimiter": docs[0].target_delimiter,
        "limit": limit,
        "subsample_seed": subsample_seed,
        "docs_in_split": len(loaded.docs),
        "add_bos": wants_bos(model) if add_bos is None else add_bos,
        "max_length": context_length(model),
        "truncated_requests": scored.truncated,
        "requests": len(scored.loglikelihoods),
        "batch_size": batch_size,
        "forward_passes": scored.forward_passes,
        "shared_contexts": scored.shared_contexts,
        "data_source": loaded.source,
        "data_version": task_data_version(),
        "notes": loaded.notes or None,
        **runtime_protocol(model),
    }
    return TaskResult(
        task=loaded.name,
        acc=sum(accs) / len(accs),
        acc_stderr=mean_stderr(accs),
        acc_norm=sum(norms) / len(norms) if has_norm else None,
        acc_norm_stderr=mean_stderr(norms) if has_norm else None,
        n=len(docs),
        chance=chance_level(docs),
        split=loaded.split,
        data_sha256=docs_sha256(docs),
        elapsed_s=time.perf_counter() - started,
        protocol=protocol,
        doc_scores=tuple(scores),
    )


def _argmax(values: Sequence[float]) -> int:
    """Index of the largest value, the first on ties (as numpy.argmax, which lm-eval uses)."""
    return max(range(len(values)), key=lambda index: (values[index], -index))
