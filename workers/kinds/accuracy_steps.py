"""Steps that score tasks in a job (`evaluate`, `prune`, `sweep`): plan the tasks (their data
checked before any scoring), score them with progress and cancellation, find or measure the dense
scores.

The rows a scored task is stored as (one per lm-eval metric) are built in `workers.kinds.rows`
(`accuracy_results`). A dense score is reused by a later job when model, revision and
ACCURACY_MATCH_KEYS agree (`steps.find_dense_baseline`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from sqlalchemy.orm import Session

from core.methods import DENSE
from core.model_sources import ModelSource
from core.prediction.paired_docs import DocEstimate
from core.specs.common import AccuracySpec
from core.tables import Result
from core.tasks import task_info
from workers.context import JobContext, JobFailure
from workers.data import DataMissingError
from workers.evaluation.paired_tasks import pairs, score_paired
from workers.evaluation.perplexity import EvaluationStopped
from workers.evaluation.task_data import TaskDataError, docs_sha256
from workers.evaluation.task_scoring import (
    FEWSHOT_SEED,
    ScoredTask,
    TaskRequest,
    docs_to_score,
    score_requested_task,
    task_request,
)
from workers.kinds.job_data import DenseAccuracy, TaskPlan
from workers.kinds.rows import accuracy_results, dtype_name
from workers.kinds.steps import find_dense_baseline, stage_progress
from workers.loading import LoadedModel

# Protocol keys that must be equal for two accuracies of one model on one task to be the same
# measurement. `data_sha256` hashes the docs as scored, few-shot prompts included.
# `max_new_tokens` is None except for generation tasks (rows stored before it existed match None).
ACCURACY_MATCH_KEYS = ("limit", "subsample_seed", "num_fewshot", "max_new_tokens", "data_sha256", "dtype")


def plan_tasks(spec: AccuracySpec, loaded: LoadedModel) -> list[TaskPlan]:
    """Load every task's docs now, so that missing or malformed data fails the job before any
    scoring, and hash the docs as they will be scored."""
    plans = []
    for name in spec.tasks:
        request = request_for(spec, name)
        try:
            split, docs = docs_to_score(request)
        except (TaskDataError, DataMissingError, ValueError) as error:
            raise JobFailure(f"accuracy on {name}: {error}") from error
        match = {
            "limit": spec.limit,
            "subsample_seed": spec.subsample_seed,
            "num_fewshot": request.num_fewshot,
            "max_new_tokens": request.max_new_tokens,
            "data_sha256": docs_sha256(docs),
            "dtype": dtype_name(loaded.dtype),
        }
        assert tuple(match) == ACCURACY_MATCH_KEYS
        plans.append(TaskPlan(name=name, split=split.split, metrics=task_info(name).metrics, match=match))
    return plans


def request_for(spec: AccuracySpec, name: str) -> TaskRequest:
    """How `name` is scored under `spec`, with the task's own defaults where the spec has none."""
    return task_request(
        name,
        limit=spec.limit,
        subsample_seed=spec.subsample_seed,
        num_fewshot=spec.num_fewshot,
        max_new_tokens=spec.max_new_tokens,
        batch_size=spec.batch_size,
        fewshot_seed=FEWSHOT_SEED,
    )


def measure_accuracy(
    context: JobContext,
    model: torch.nn.Module,
    tokenizer: Any,
    spec: AccuracySpec,
    tasks: list[str],
    *,
    stage: str,
    start: float,
    end: float,
    detail_prefix: str = "",
    dense: dict[str, DenseAccuracy] | None = None,
    order_seed: int = 0,
) -> list[ScoredTask]:
    """Score `model` on each task in turn, reporting `stage` with detail '<task> i/N' within
    [start, end] of the job; stops at the next batch when the job must stop. With `spec.precision`
    and the dense model's right-or-wrong record of a task in `dense`, the task's docs are scored in
    the seeded order until the paired band reaches the precision (`score_paired`)."""
    results: list[ScoredTask] = []
    for position, name in enumerate(tasks):
        low = stage_progress(start, end, position, len(tasks))
        high = stage_progress(start, end, position + 1, len(tasks))
        detail = f"{detail_prefix}{name} {position + 1}/{len(tasks)}"
        context.report(stage, low, detail)

        def report(done: int, total: int, low: float = low, high: float = high, detail: str = detail) -> None:
            context.report(stage, stage_progress(low, high, done, total), detail)

        def look(
            found: dict[str, DocEstimate], low: float = low, high: float = high, detail: str = detail
        ) -> None:
            first = next(iter(found.values()))
            band = max(e.half_width for e in found.values())
            context.report(
                stage,
                stage_progress(low, high, first.docs, first.of_docs),
                f"{detail}: doc {first.docs} of at most {first.of_docs}, band ±{100 * band:.1f} points",
            )

        request = request_for(spec, name)
        record = None if dense is None or name not in dense else dense_record(dense[name])
        try:
            if spec.precision is not None and record is not None and pairs(request):
                results.append(
                    score_paired(
                        model,
                        tokenizer,
                        request,
                        record,
                        spec.precision,
                        order_seed,
                        on_look=look,
                        should_stop=context.should_stop,
                    )
                )
            else:
                results.append(
                    score_requested_task(
                        model, tokenizer, request, progress=report, should_stop=context.should_stop
                    )
                )
        except EvaluationStopped:
            context.check_stop()
            raise
        except (TaskDataError, DataMissingError, ValueError) as error:
            raise JobFailure(f"accuracy on {name}: {error}") from error
    return results


def dense_record(dense: DenseAccuracy) -> dict[str, list[int]] | None:
    """The dense model's right-or-wrong record of every metric of a task, None where a row lacks one
    (stored before records were kept, or a task whose metrics are not right or wrong per doc)."""
    record = {metric: row.protocol.get("doc_scores") for metric, row in dense.results.items()}
    if any(rights is None for rights in record.values()):
        return None
    return {metric: list(rights) for metric, rights in record.items() if rights is not None}


def _dense_rows(
    session: Session,
    *,
    source: ModelSource,
    loaded: LoadedModel,
    plan: TaskPlan,
    own_job_id: str,
    parent_job_id: str | None,
) -> dict[str, Result | None]:
    """The reusable dense result of each metric of the task (None where there is none)."""
    return {
        metric: find_dense_baseline(
            session,
            source.model_id,
            loaded.revision,
            plan.name,
            plan.match,
            metric=metric,
            match_keys=ACCURACY_MATCH_KEYS,
            own_job_id=own_job_id,
            parent_job_id=parent_job_id,
        )
        for metric in plan.metrics
    }


def dense_accuracy(
    context: JobContext,
    source: ModelSource,
    loaded: LoadedModel,
    spec: AccuracySpec,
    plans: list[TaskPlan],
    environment: dict[str, Any],
    seed: int,
    *,
    start: float,
    end: float,
) -> dict[str, DenseAccuracy]:
    """The dense accuracy of every task: reused from the store when this model was scored so
    before (every metric of the task found), else measured on `loaded.model` (unchanged) and
    stored as (dense, 0) results of this job."""
    found: dict[str, DenseAccuracy] = {}
    for plan in plans:
        rows = context.read(
            partial(
                _dense_rows,
                source=source,
                loaded=loaded,
                plan=plan,
                own_job_id=context.job_id,
                parent_job_id=context.parent_id,
            ),
            f"looking for a dense {plan.name} accuracy to reuse",
        )
        if all(row is not None for row in rows.values()):
            reused = {metric: row for metric, row in rows.items() if row is not None}
            found[plan.name] = DenseAccuracy(
                reused, any(row.job_id != context.job_id for row in reused.values())
            )
    missing = [plan.name for plan in plans if plan.name not in found]
    if found:
        ids = ", ".join(str(row.id) for dense in found.values() for row in dense.results.values())
        context.report("dense accuracy", start, f"reused results {ids}")
    for measured in measure_accuracy(
        context, loaded.model, loaded.tokenizer, spec, missing, stage="dense accuracy", start=start, end=end
    ):
        rows_measured = accuracy_results(
            measured,
            source=source,
            loaded=loaded,
            method=DENSE,
            sparsity=0.0,
            seed=seed,
            environment=environment,
            keep_docs=True,
        )
        context.add_results(rows_measured)
        found[measured.task] = DenseAccuracy({row.metric: row for row in rows_measured}, False)
    return found
