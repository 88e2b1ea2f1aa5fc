"""The evaluation tasks the service scores, torch-free: what the API validates, the store's metric
names and the lm-eval export read, and what the workers' task registries must agree with (a test
checks `workers.evaluation.mc_formats.TASKS` and `workers.evaluation.generative_tasks.TASKS`
against this catalogue).

Three kinds, as lm-evaluation-harness calls them (`output_type`), see docs/science.md §4:
- `multiple_choice`: each option's log-likelihood, `acc` (argmax) and `acc_norm` (per character);
- `loglikelihood`: one target continuation per doc (LAMBADA's last word), `acc` when greedy decoding
  would produce exactly the target, and `perplexity` of the target;
- `generate_until`: greedy generation until a stop sequence or a token limit, then answers
  extracted by each named filter and scored by exact match (GSM8K).

A metric name is what the store's `Result.metric` holds: lm-eval's metric name, with its filter
after a comma when the task applies one (`exact_match,strict-match`), exactly lm-eval's result key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

OutputType = Literal["multiple_choice", "loglikelihood", "generate_until"]
NO_FILTER = "none"  # lm-eval's filter name when no filter applies


@dataclass(frozen=True)
class TaskInfo:
    """One task as the API and the store see it."""

    name: str  # lm-eval's task name
    output_type: OutputType
    metrics: tuple[str, ...]  # metric names as stored (filter after a comma where one applies)
    default_fewshot: int  # lm-eval's `num_fewshot` for the task
    version: float  # lm-eval's `metadata.version` of the task YAML
    lower_is_better: tuple[str, ...] = ()  # metrics where less is better (perplexity)
    max_new_tokens: int | None = None  # generation limit (lm-eval's `max_gen_toks`) for generate_until

    @property
    def headline(self) -> str:
        """The one score a comparison across tasks reads: `acc`, or for GSM8K the flexible filter
        (a base model's answer line often lacks the exact "#### N" the strict one needs)."""
        return FLEXIBLE_EXTRACT if FLEXIBLE_EXTRACT in self.metrics else "acc"

    @property
    def generative(self) -> bool:
        """True when the model's own greedy decoding decides the score (not only option scores)."""
        return self.output_type != "multiple_choice"


_MC = ("acc", "acc_norm")
STRICT_MATCH = "exact_match,strict-match"
FLEXIBLE_EXTRACT = "exact_match,flexible-extract"

TASK_CATALOGUE: dict[str, TaskInfo] = {
    info.name: info
    for info in (
        TaskInfo("arc_easy", "multiple_choice", _MC, 0, 1.0),
        TaskInfo("arc_challenge", "multiple_choice", _MC, 0, 1.0),
        TaskInfo("piqa", "multiple_choice", _MC, 0, 1.0),
        TaskInfo("hellaswag", "multiple_choice", _MC, 0, 1.0),
        TaskInfo("winogrande", "multiple_choice", ("acc",), 0, 1.0),
        TaskInfo("boolq", "multiple_choice", _MC, 0, 2.0),
        TaskInfo("openbookqa", "multiple_choice", _MC, 0, 1.0),
        TaskInfo("lambada_openai", "loglikelihood", ("perplexity", "acc"), 0, 1.0, ("perplexity",)),
        TaskInfo("gsm8k", "generate_until", (STRICT_MATCH, FLEXIBLE_EXTRACT), 5, 3.0, max_new_tokens=256),
    )
}

ACCURACY_METRICS: tuple[str, ...] = ("acc", "acc_norm")
"""Metrics the calibrated accuracy laws fit and predict (a fraction correct with a chance floor)."""
SCORE_METRICS: tuple[str, ...] = (*ACCURACY_METRICS, STRICT_MATCH, FLEXIBLE_EXTRACT)
"""Every fraction-correct metric: what an accuracy-drop gate checks."""
TASK_METRICS: tuple[str, ...] = tuple(
    dict.fromkeys(metric for info in TASK_CATALOGUE.values() for metric in info.metrics)
)
"""Every metric a task result may carry."""


def task_info(name: str) -> TaskInfo:
    if name not in TASK_CATALOGUE:
        raise ValueError(f"unknown task {name!r}; known: {', '.join(TASK_CATALOGUE)}")
    return TASK_CATALOGUE[name]


def lm_eval_keys(metric: str) -> tuple[str, str]:
    """(value key, stderr key) of a stored metric in an lm-eval results file: `acc,none` and
    `acc_stderr,none`; `exact_match,strict-match` and `exact_match_stderr,strict-match`."""
    name, _, applied = metric.partition(",")
    applied = applied or NO_FILTER
    return f"{name},{applied}", f"{name}_stderr,{applied}"
