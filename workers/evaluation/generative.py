"""Scores of the generative tasks (`workers.evaluation.generative_tasks`), by lm-evaluation-harness's rules.

- `loglikelihood` (LAMBADA): every target is scored in one pass with the multiple-choice scorer
  (`loglikelihood.score_encoded`, same encoding and batching): `acc` is the fraction of targets that are
  the greedy continuation (every target token the argmax given the ones before, which is exactly
  "greedy decoding from the context produces the target": a test checks it against
  `greedy.greedy_generate`), `perplexity` is exp(-mean target log-likelihood), lm-eval's aggregation.
- `generate_until` (GSM8K): greedy generation (`greedy.greedy_generate`), the answer of each filter
  extracted and compared with the reference by exact match.

Standard errors: lm-eval's for means (sample sd / sqrt n); for perplexity lm-eval bootstraps,
here the delta method, ppl x stderr of the mean log-likelihood (stated in the protocol).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from core.tasks import task_info
from workers.evaluation.generative_tasks import GSM8K_FILTERS, GenDoc, GenTask, exact_match
from workers.evaluation.greedy import greedy_generate
from workers.evaluation.loglikelihood import DEFAULT_BATCH_SIZE, encode_requests, score_encoded
from workers.evaluation.model_facts import context_length, mean_stderr, runtime_protocol, wants_bos
from workers.evaluation.task_data import FEWSHOT_DELIMITER, docs_sha256, task_data_version

EXAMPLES_KEPT = 3
"""Generations recorded in the protocol, so a reader sees what the model wrote."""
GENERATION_FILTERS: dict[str, dict[str, Callable[[str], str]]] = {"gsm8k": GSM8K_FILTERS}
"""Task -> metric -> the filter that extracts its answer from a generation."""


@dataclass(frozen=True)
class GenerativeResult:
    """One generative task's metrics, with what is needed to reproduce or compare them."""

    task: str
    values: dict[str, tuple[float, float | None]]  # metric -> (value, stderr)
    n: int
    split: str
    data_sha256: str
    elapsed_s: float
    protocol: dict[str, Any]
    chance: float = 0.0  # nothing is guessed among options: a random answer scores 0
    per_doc: dict[str, tuple[float, ...]] = field(default_factory=dict)  # metric -> each doc's score

    def metric_values(self) -> dict[str, tuple[float, float | None]]:
        return dict(self.values)


def _base_protocol(
    model: torch.nn.Module, task: GenTask, docs: Sequence[GenDoc], *, harness: str, **entries: Any
) -> dict[str, Any]:
    num_fewshot = entries.pop("num_fewshot")
    return {
        "harness": harness,
        "num_fewshot": num_fewshot,
        "fewshot_seed": entries.pop("fewshot_seed") if num_fewshot else None,
        "fewshot_source": f"{task.split} split, excluding the scored doc" if num_fewshot else None,
        "fewshot_delimiter": FEWSHOT_DELIMITER,
        "target_delimiter": docs[0].target_delimiter,
        "docs_in_split": len(task.docs),
        "add_bos": wants_bos(model),
        "max_length": context_length(model),
        "data_source": task.source,
        "data_version": task_data_version(),
        "notes": task.notes or None,
        **entries,
        **runtime_protocol(model),
    }


def score_target_task(
    model: torch.nn.Module,
    tokenizer: Any,
    task: GenTask,
    docs: Sequence[GenDoc],
    *,
    num_fewshot: int,
    fewshot_seed: int,
    limit: int | None,
    subsample_seed: int | None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> GenerativeResult:
    """`acc` (target = greedy continuation) and `perplexity` of the targets of `docs`."""
    started = time.perf_counter()
    encoded = encode_requests(
        model, tokenizer, [(doc.context, doc.continuation) for doc in docs], add_bos=None
    )
    scored = score_encoded(model, encoded, batch_size=batch_size, progress=progress, should_stop=should_stop)
    hits = [float(hit) for hit in scored.greedy]
    lls = scored.loglikelihoods
    mean_ll = sum(lls) / len(lls)
    ppl = math.exp(-mean_ll)
    ll_stderr = mean_stderr(lls)
    protocol = _base_protocol(
        model,
        task,
        docs,
        harness="lm-evaluation-harness (loglikelihood: acc = greedy continuation, perplexity)",
        num_fewshot=num_fewshot,
        fewshot_seed=fewshot_seed,
        limit=limit,
        subsample_seed=subsample_seed,
        perplexity_stderr="delta method: perplexity x stderr of the mean log-likelihood",
        target_tokens=sum(len(request.continuation) for request in encoded),
        truncated_requests=scored.truncated,
        requests=len(encoded),
        batch_size=batch_size,
        forward_passes=scored.forward_passes,
    )
    return GenerativeResult(
        task=task.name,
        values={
            "perplexity": (ppl, None if ll_stderr is None else ppl * ll_stderr),
            "acc": (sum(hits) / len(hits), mean_stderr(hits)),
        },
        n=len(docs),
        split=task.split,
        data_sha256=docs_sha256(docs),
        elapsed_s=time.perf_counter() - started,
        protocol=protocol,
        per_doc={"acc": tuple(hits), "loglikelihood": tuple(lls)},
    )


def encode_prompts(
    model: torch.nn.Module, tokenizer: Any, docs: Sequence[GenDoc], max_new_tokens: int
) -> tuple[list[list[int]], int]:
    """Each doc's context as generation prompt ids (BOS first where lm-eval adds one), cut on the
    left to leave room for `max_new_tokens` in the context length; (prompts, how many were cut)."""
    bos_id = getattr(tokenizer, "bos_token_id", None)
    prefix = [bos_id] if wants_bos(model) and bos_id is not None else []
    limit = context_length(model)
    room = None if limit is None else max(1, limit - max_new_tokens)
    prompts, cut = [], 0
    for ids in tokenizer([doc.context for doc in docs], add_special_tokens=False)["input_ids"]:
        prompt = prefix + list(ids)
        if room is not None and len(prompt) > room:
            prompt, cut = prompt[-room:], cut + 1
        prompts.append(prompt)
    return prompts, cut


def score_generation_task(
    model: torch.nn.Module,
    tokenizer: Any,
    task: GenTask,
    docs: Sequence[GenDoc],
    *,
    num_fewshot: int,
    fewshot_seed: int,
    limit: int | None,
    subsample_seed: int | None,
    max_new_tokens: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> GenerativeResult:
    """Greedy generations of `docs`, scored by exact match under each of the task's filters."""
    started = time.perf_counter()
    filters = GENERATION_FILTERS[task.name]
    budget = max_new_tokens if max_new_tokens is not None else task_info(task.name).max_new_tokens
    assert budget is not None
    stop = docs[0].stop
    prompts, cut = encode_prompts(model, tokenizer, docs, budget)
    eos = getattr(tokenizer, "eos_token_id", None)
    generations = greedy_generate(
        model,
        tokenizer,
        prompts,
        max_new_tokens=budget,
        stop=stop,
        eos_ids=() if eos is None else (int(eos),),
        batch_size=batch_size,
        progress=progress,
        should_stop=should_stop,
    )
    scores: dict[str, list[float]] = {metric: [] for metric in filters}
    examples: list[dict[str, Any]] = []
    for doc, generation in zip(docs, generations, strict=True):
        answers = {metric: extract(generation.text) for metric, extract in filters.items()}
        for metric, answer in answers.items():
            scores[metric].append(exact_match(answer, doc.target))
        if len(examples) < EXAMPLES_KEPT:
            examples.append(
                {
                    "doc_id": doc.doc_id,
                    "generation": generation.text,
                    "answers": answers,
                    "target": doc.target,
                }
            )
    protocol = _base_protocol(
        model,
        task,
        docs,
        harness="lm-evaluation-harness (generate_until, greedy; exact_match per filter)",
        num_fewshot=num_fewshot,
        fewshot_seed=fewshot_seed,
        limit=limit,
        subsample_seed=subsample_seed,
        max_new_tokens=budget,
        stop_sequences=list(stop),
        stop_at_eos=eos is not None,
        truncated_prompts=cut,
        batch_size=batch_size,
        stopped_by=dict(Counter(generation.stopped_by for generation in generations)),
        mean_generated_tokens=round(sum(len(g.tokens) for g in generations) / len(generations), 2),
        examples=examples,
    )
    return GenerativeResult(
        task=task.name,
        values={
            metric: (sum(values) / len(values), mean_stderr(values)) for metric, values in scores.items()
        },
        n=len(docs),
        split=task.split,
        data_sha256=docs_sha256(docs),
        elapsed_s=time.perf_counter() - started,
        protocol=protocol,
        per_doc={metric: tuple(values) for metric, values in scores.items()},
    )
