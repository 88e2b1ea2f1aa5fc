"""The result rows the measuring kinds (`evaluate`, `prune`, `sweep`, `simulate`) store, built from
what the steps measured.

The steps (`workers.kinds.steps`, `prune_steps`, `accuracy_steps`) load, prune and score; this module
turns their measurements into `core.tables.Result` rows and protocols, so that every kind stores a
measurement alike and a later job finds it by protocol:

- a perplexity: `ppl` with `perplexity_protocol` (docs/science.md §4); the dense one is
  `dense_perplexity_result`;
- an accuracy: one row per lm-eval metric the task defines (`core.tasks`: `acc`, and `acc_norm`
  except for WinoGrande; LAMBADA's `perplexity` and `acc`; GSM8K's `exact_match,strict-match` and
  `exact_match,flexible-extract`), with the task name as `dataset`, its split as `split`, the
  standard error as `stderr` and the docs scored as `n`; the protocol is the scorer's
  (`ScoredTask.protocol`) plus `chance`, the hash of the docs as scored, timings and versions
  (`accuracy_results`);
- a pruned model: its `ppl` and `param_fraction_removed` (`pruned_results`) and its accuracy
  (`pruned_accuracy_results`), under the method name its pattern and layout make (`stored_method`).

Which protocol keys a reused dense row must share: `steps.BASELINE_MATCH_KEYS` and
`accuracy_steps.ACCURACY_MATCH_KEYS`. A kind's own rows (a sweep's fits, a probe's points, a
profile, a simulated curve) are built in that kind's module.
"""

from __future__ import annotations

from typing import Any

import torch

from core.methods import DENSE, METHODS
from core.model_sources import ModelSource
from core.specs.common import PerplexitySpec
from core.specs.jobs import PruneJobCreate
from core.specs.simulate import SimulateJobCreate
from core.tables import Result
from workers.data import TextCorpus
from workers.evaluation.paired_tasks import doc_record
from workers.evaluation.perplexity import PerplexityResult
from workers.evaluation.task_scoring import FEWSHOT_SEED, ScoredTask
from workers.kinds.job_data import Measured, Prepared, PruningJob
from workers.loading import LoadedModel
from workers.pruners import pruner_for

# Results that describe the model rather than a measurement on data carry this dataset name.
NO_DATASET = "none"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def job_pattern(spec: PruningJob | SimulateJobCreate) -> str:
    return spec.pattern if isinstance(spec, PruneJobCreate) else "unstructured"


def stored_method(spec: PruningJob | SimulateJobCreate) -> str:
    """The method name the job's pruned results are stored under (pattern and layout included)."""
    return METHODS[spec.method].stored_name(job_pattern(spec), spec.layout)


def perplexity_protocol(
    measured: PerplexityResult, spec: PerplexitySpec, corpus: TextCorpus, dtype: torch.dtype, seed: int
) -> dict[str, Any]:
    """What a perplexity was measured with (docs/science.md §4); BASELINE_MATCH_KEYS are among them."""
    return {
        "seqlen": measured.seqlen,
        "requested_seqlen": spec.seqlen,
        "windows": measured.windows,
        "max_windows": spec.max_windows,
        "nll_mean": measured.nll_mean,
        "data_sha256": corpus.sha256,
        "seed": seed,
        "dtype": dtype_name(dtype),
        "elapsed_s": round(measured.elapsed_s, 3),
        "window_nll": list(measured.window_nll),  # per window scored: what pairing and its study need
        **sampling_protocol(measured, spec, seed),
    }


def sampling_protocol(measured: PerplexityResult, spec: PerplexitySpec, seed: int) -> dict[str, Any]:
    """A perplexity scored to a precision: `sampling` (which windows, in the order of `window_nll`, the
    estimator, the band for the full-window value); nothing for a full-window measurement."""
    if measured.sampling is None:
        return {}
    return {"sampling": measured.sampling.to_dict(spec.precision, seed)}


def sampled_stderr(measured: PerplexityResult) -> float | None:
    """The standard error of a perplexity scored on part of the windows (delta method from ln PPL)."""
    if measured.sampling is None:
        return None
    return measured.sampling.stderr_log * measured.ppl


def dense_perplexity_result(
    measured: PerplexityResult,
    *,
    source: ModelSource,
    loaded: LoadedModel,
    spec: PerplexitySpec,
    corpus: TextCorpus,
    seed: int,
    environment: dict[str, Any],
) -> Result:
    """The (dense, 0) `ppl` row of a model measured as it is (an `evaluate` job, a dense baseline)."""
    return Result(
        model_id=source.model_id,
        model_revision=loaded.revision,
        method=DENSE,
        sparsity=0.0,
        metric="ppl",
        dataset=spec.dataset,
        split=corpus.split,
        value=measured.ppl,
        stderr=sampled_stderr(measured),
        n=measured.tokens_scored,
        source="measured",
        protocol={
            **perplexity_protocol(measured, spec, corpus, loaded.dtype, seed),  # window_nll: what pairs
            **environment,
        },
    )


def accuracy_results(
    measured: ScoredTask,
    *,
    source: ModelSource,
    loaded: LoadedModel,
    method: str,
    sparsity: float,
    seed: int,
    environment: dict[str, Any],
    extra_protocol: dict[str, dict[str, Any]] | None = None,
    source_kind: str = "measured",
    keep_docs: bool = False,
) -> list[Result]:
    """One row per metric the task defines. `extra_protocol` maps a metric to protocol entries
    for its row only (e.g. the dense result a pruned accuracy compares with); `source_kind` is the
    rows' `source` (a simulation's scores are `simulated`). `keep_docs` (the dense scores) stores
    each metric's right-or-wrong record per doc, which pruned scores pair with (`paired_tasks`)."""
    protocol: dict[str, Any] = {
        **measured.protocol,
        "task": measured.task,
        "chance": measured.chance,
        "data_sha256": measured.data_sha256,
        "fewshot_seed": FEWSHOT_SEED if measured.protocol.get("num_fewshot") else None,
        "seed": seed,
        "elapsed_s": round(measured.elapsed_s, 3),
        **environment,
    }
    values = measured.metric_values()
    record = doc_record(measured) if keep_docs else None
    return [
        Result(
            model_id=source.model_id,
            model_revision=loaded.revision,
            method=method,
            sparsity=sparsity,
            metric=metric,
            dataset=measured.task,
            split=measured.split,
            value=value,
            stderr=stderr,
            n=measured.n,
            source=source_kind,
            protocol={
                **protocol,
                **(extra_protocol or {}).get(metric, {}),
                **({"doc_scores": record[metric]} if record is not None else {}),
            },
        )
        for metric, (value, stderr) in values.items()
    ]


def pruned_results(
    prepared: Prepared,
    spec: PruningJob,
    outcome: Measured,
    *,
    timings: dict[str, float],
    extra_protocol: dict[str, Any] | None = None,
) -> list[Result]:
    """The rows a sliced model is stored as: its `ppl` (protocol = perplexity protocol + the dense
    baseline it compares with + calibration record + slicing report + timings + versions, then
    `extra_protocol`) and its `param_fraction_removed` (the real fraction of parameters removed,
    which differs from the sparsity of the residual width)."""
    loaded, report = prepared.loaded, outcome.report
    protocol: dict[str, Any] = {
        **perplexity_protocol(
            outcome.perplexity, prepared.data.spec, prepared.data.corpus, loaded.dtype, spec.seed
        ),
        "method": spec.method,
        "dense_result_id": prepared.dense.id,
        "dense_ppl": prepared.dense.value,
        "dense_reused": prepared.dense_reused,
        "calibration": prepared.calibration_record,
        "pattern": job_pattern(spec),
        METHODS[spec.method].stage: report.to_dict(),
        "artifact": outcome.artifact_path,
        "timings": timings,
        **(extra_protocol or {}),
        **prepared.environment,
    }
    return [
        Result(
            model_id=prepared.source.model_id,
            model_revision=loaded.revision,
            method=stored_method(spec),
            sparsity=outcome.sparsity,
            metric="ppl",
            dataset=prepared.data.spec.dataset,
            split=prepared.data.corpus.split,
            value=outcome.perplexity.ppl,
            stderr=sampled_stderr(outcome.perplexity),
            n=outcome.perplexity.tokens_scored,
            source="measured",
            protocol=protocol,
        ),
        Result(
            model_id=prepared.source.model_id,
            model_revision=loaded.revision,
            method=stored_method(spec),
            sparsity=outcome.sparsity,
            metric="param_fraction_removed",
            dataset=NO_DATASET,
            value=report.param_fraction_removed,
            source="measured",
            protocol={
                **pruner_for(spec.method).describe(report),
                **(extra_protocol or {}),
                **prepared.environment,
            },
        ),
    ]


def pruned_accuracy_results(
    prepared: Prepared,
    spec: PruningJob,
    outcome: Measured,
    scored: list[ScoredTask],
    *,
    extra_protocol: dict[str, Any] | None = None,
) -> list[Result]:
    """The rows of a pruned model's accuracy (`compared_accuracy_results`), with the model's shape
    and the artifact, then `extra_protocol`."""
    extra = {
        **pruner_for(spec.method).shape(outcome.report),
        "param_fraction_removed": outcome.report.param_fraction_removed,
        "artifact": outcome.artifact_path,
        **(extra_protocol or {}),
    }
    return compared_accuracy_results(prepared, spec, scored, sparsity=outcome.sparsity, extra=extra)


def compared_accuracy_results(
    prepared: Prepared,
    spec: PruningJob | SimulateJobCreate,
    scored: list[ScoredTask],
    *,
    sparsity: float,
    extra: dict[str, Any],
    source_kind: str = "measured",
) -> list[Result]:
    """Per task and metric (`accuracy_results`) at `sparsity`: each row beside the dense result it
    compares with and the calibration record, then `extra`."""
    rows = []
    for measured in scored:
        dense = prepared.dense_accuracy[measured.task]
        per_metric = {
            metric: {
                "method": spec.method,
                "dense_result_id": row.id,
                "dense_value": row.value,
                "dense_reused": dense.reused,
                "calibration": prepared.calibration_record,
                **extra,
            }
            for metric, row in dense.results.items()
        }
        rows += accuracy_results(
            measured,
            source=prepared.source,
            loaded=prepared.loaded,
            method=stored_method(spec),
            sparsity=sparsity,
            seed=spec.seed,
            environment=prepared.environment,
            extra_protocol=per_metric,
            source_kind=source_kind,
        )
    return rows
