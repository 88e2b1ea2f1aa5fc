"""Steps of the kinds that prune a model (`prune`, `sweep`; `simulate`, `probe` and `profile` take
some): load a model the method can prune, measure or reuse its dense baseline (and dense accuracy),
draw the calibration windows, prune one dense copy at one sparsity, save it and measure it.

A `prune` job runs `prepare` and then `prune_and_measure` once. A `sweep` runs `prepare` once and
`prune_and_measure` once per sparsity, each on a fresh dense copy (`workers.loading.refresh_model`)
with the same calibration windows, so a sweep stores, point for point, the results a `prune` job
with the same request fields would store: the rows are built from `Prepared` and `Measured` in
`workers.kinds.rows` (`pruned_results`, `pruned_accuracy_results`), and the pruned model is saved
and described by `workers.artifacts`.

Methods differ only in their pruner (`workers.pruners`, chosen by the method's kind in
`core.methods`): how it prunes, describes and saves a model; everything around it is shared.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from core.methods import METHODS
from core.specs.common import AccuracySpec, CalibrationSpec
from core.specs.simulate import SimulateJobCreate
from workers.architectures import UnsupportedArchitectureError, match_structure
from workers.artifacts import save_artifact
from workers.calibration import CalibrationBatch, CalibrationError, build_calibration, calibration_corpus
from workers.context import JobContext, JobFailure
from workers.data import DataMissingError
from workers.environment import run_environment
from workers.evaluation.perplexity import effective_seqlen
from workers.evaluation.task_scoring import ScoredTask
from workers.kinds.accuracy_steps import (
    dense_accuracy,
    measure_accuracy,
    plan_tasks,
)
from workers.kinds.job_data import DenseAccuracy, Measured, Prepared, PruningJob
from workers.kinds.rows import job_pattern
from workers.kinds.steps import (
    dense_baseline,
    load_for_job,
    measure_perplexity,
    perplexity_data,
    step_reporter,
)
from workers.loading import LoadedModel
from workers.offload import suspended
from workers.pruners import PruneOptions, PruneRun, Report, pruner_for

# How `prune_and_measure` splits its share of the job's progress: pruning, saving, perplexity.
# (A prune job gives it 0.30-1.00: slicing 0.30-0.75, saving 0.75-0.80, perplexity 0.80-1.00.)
SLICING_SHARE = 45 / 70
SAVING_SHARE = 5 / 70


@dataclass(frozen=True)
class PrepareSpans:
    """Where `prepare`'s stages sit in the job's progress (0..1)."""

    load: float
    baseline: tuple[float, float]
    calibration: tuple[float, float]


def lap(since: float) -> float:
    return round(time.perf_counter() - since, 3)


def prepare(
    context: JobContext,
    spec: PruningJob | SimulateJobCreate,
    spans: PrepareSpans,
    accuracy: AccuracySpec | None = None,
) -> Prepared:
    """Load the model (refusing unsupported architectures before any measurement), then the dense
    baseline (reused from the store when the same model, data and protocol were measured before),
    the dense accuracy on `accuracy`'s tasks (reused likewise; the second half of the baseline
    span) and the calibration windows."""
    timings: dict[str, float] = {}
    started = time.perf_counter()
    context.report("loading model", spans.load, spec.model)
    source, loaded = load_for_job(context, spec)
    try:
        check_prunable(loaded.model, spec.method)  # refuse before spending time on the dense baseline
    except UnsupportedArchitectureError as error:
        raise JobFailure(str(error)) from error
    environment = run_environment(loaded.device, loaded.memory_plan)
    context.set_environment(environment)
    timings["load_s"] = lap(started)
    plans = plan_tasks(accuracy, loaded) if accuracy is not None else []  # data checked up front

    lap_started = time.perf_counter()
    baseline_start, baseline_end = spans.baseline
    ppl_end = (baseline_start + baseline_end) / 2 if plans else baseline_end
    context.report("dense baseline", baseline_start, spec.perplexity.dataset)
    data = perplexity_data(context, loaded, spec.perplexity)
    dense, reused = dense_baseline(
        context, source, loaded, data, environment, spec.seed, start=baseline_start, end=ppl_end
    )
    timings["dense_baseline_s"] = lap(lap_started)
    dense_acc: dict[str, DenseAccuracy] = {}
    if accuracy is not None:
        lap_started = time.perf_counter()
        dense_acc = dense_accuracy(
            context, source, loaded, accuracy, plans, environment, spec.seed, start=ppl_end, end=baseline_end
        )
        timings["dense_accuracy_s"] = lap(lap_started)

    lap_started = time.perf_counter()
    context.report("calibration", spans.calibration[0], spec.calibration.corpus)
    calibration, record = draw_calibration(context, loaded, spec.calibration, spec.seed, spec.method)
    timings["calibration_s"] = lap(lap_started)
    return Prepared(
        source=source,
        loaded=loaded,
        environment=environment,
        data=data,
        dense=dense,
        dense_reused=reused,
        calibration=calibration,
        calibration_record=record,
        timings=timings,
        accuracy_plans=plans,
        dense_accuracy=dense_acc,
    )


def check_prunable(model: PreTrainedModel, method: str) -> None:
    """Refuse, as a JobFailure naming the reason, a model `method`'s pruner cannot prune."""
    try:
        pruner_for(method).check(model)
    except UnsupportedArchitectureError as error:
        raise JobFailure(str(error)) from error


def draw_calibration(
    context: JobContext,
    loaded: LoadedModel,
    spec: CalibrationSpec,
    job_seed: int,
    method: str,
    avoid: CalibrationBatch | None = None,
) -> tuple[CalibrationBatch | None, dict[str, Any] | None]:
    """The seeded calibration windows `method` prunes with, and their record; (None, None) for
    methods that read no data. With `avoid`, none of the windows overlaps its windows."""
    if not METHODS[method].calibrated:
        return None, None
    try:
        corpus = calibration_corpus(spec.corpus, spec.text, context.settings)
        calibration = build_calibration(
            loaded.tokenizer,
            corpus,
            num_sequences=spec.num_sequences,
            seqlen=effective_seqlen(loaded.model, spec.seqlen),
            seed=job_seed if spec.seed is None else spec.seed,
            settings=context.settings,
            requested_seqlen=spec.seqlen,
            avoid=avoid,
        )
    except (DataMissingError, CalibrationError) as error:
        raise JobFailure(str(error)) from error
    return calibration, {**calibration.record, "batch_size": spec.batch_size}


def apply_method(
    context: JobContext,
    model: PreTrainedModel,
    method: str,
    sparsity: float,
    calibration: CalibrationBatch | None,
    options: PruneOptions,
    *,
    device: torch.device,
    start: float,
    end: float,
    detail_prefix: str = "",
) -> Report:
    """Prune the dense `model` in place with `method` at `sparsity`, reporting "block i/L" within
    [start, end]. Stops with JobStopped at a safe point (before a block) when the job must stop; the
    partly pruned model must then be discarded. The engine's ValueErrors become JobFailures."""
    entry, pruner = METHODS[method], pruner_for(method)
    progress = step_reporter(context, entry.stage, start, end, "block", detail_prefix)
    try:
        run = PruneRun(
            calibration_ids=None if calibration is None else calibration.input_ids,
            attention_mask=None if calibration is None else calibration.attention_mask,
            options=options,
            device=device,
            progress=progress,
            should_stop=context.should_stop,
        )
        with suspended(model, blocks_after=lambda pruned: match_structure(pruned).blocks(pruned)):
            return pruner.prune(model, entry, sparsity, run)  # the engine streams blocks itself
    except pruner.stopped:
        context.check_stop()
        raise
    except ValueError as error:  # UnsupportedArchitectureError included
        raise JobFailure(f"{entry.stage}: {error}") from error


def prune_options(spec: PruningJob) -> PruneOptions:
    return PruneOptions(
        pattern=job_pattern(spec),
        round_to=spec.round_to,
        slice_head=spec.slice_head,
        batch_size=spec.calibration.batch_size,
        layout=spec.layout,
        keep_bases=spec.keep_bases,
    )


def prune_and_measure(
    context: JobContext,
    prepared: Prepared,
    model: PreTrainedModel,
    spec: PruningJob,
    sparsity: float,
    *,
    start: float,
    end: float,
    artifact_folder: Path | None,
    detail_prefix: str = "",
) -> Measured:
    """Prune the dense `model` in place at `sparsity` with the job's method, save it to
    `artifact_folder` (recorded as an artifact of the job) when given, and score it, reporting
    progress within [start, end].

    Stops with JobStopped at a safe point (before a block, before a window) when the job must stop;
    the partly pruned model must then be discarded.
    """
    pruning_end = start + (end - start) * SLICING_SHARE
    saving_end = pruning_end + (end - start) * SAVING_SHARE
    timings: dict[str, float] = {}
    lap_started = time.perf_counter()
    report = apply_method(
        context,
        model,
        spec.method,
        sparsity,
        prepared.calibration,
        prune_options(spec),
        device=prepared.loaded.device,
        start=start,
        end=pruning_end,
        detail_prefix=detail_prefix,
    )
    timings[f"{METHODS[spec.method].stage}_s"] = lap(lap_started)

    artifact_path: str | None = None
    if artifact_folder is not None:
        lap_started = time.perf_counter()
        context.report("saving", pruning_end, f"{detail_prefix}pruned model")
        artifact = save_artifact(
            model,
            pruner_for(spec.method),
            report,
            artifact_folder,
            prepared.source.model_id,
            prepared.loaded.revision,
            prepared.calibration_record,
            tokenizer=prepared.loaded.tokenizer,
        )
        context.add_artifacts([artifact])
        artifact_path = artifact.path
        timings["save_s"] = lap(lap_started)

    lap_started = time.perf_counter()
    context.report("perplexity", saving_end, f"{detail_prefix}{prepared.data.spec.dataset}")
    measured = measure_perplexity(
        context,
        model,
        prepared.data.token_ids,
        prepared.data.spec,
        prepared.data.seqlen,
        stage="perplexity",
        start=saving_end,
        end=end,
        detail_prefix=detail_prefix,
        precision=prepared.data.spec.precision,
        order_seed=spec.seed,
        dense_window_nll=prepared.dense.protocol.get("window_nll"),
    )
    timings["perplexity_s"] = lap(lap_started)
    return Measured(sparsity, report, measured, artifact_path, timings)


def score_pruned_accuracy(
    context: JobContext,
    prepared: Prepared,
    accuracy: AccuracySpec | None,
    outcome: Measured,
    *,
    start: float,
    end: float,
    detail_prefix: str = "",
    order_seed: int = 0,
) -> list[ScoredTask]:
    """Score the pruned model on the prepared tasks (none when the job asked for no accuracy); with
    the accuracy's `precision`, on docs in the order `order_seed` draws, paired with the dense ones."""
    if accuracy is None:
        return []
    started = time.perf_counter()
    scored = measure_accuracy(
        context,
        prepared.loaded.model,
        prepared.loaded.tokenizer,
        accuracy,
        [plan.name for plan in prepared.accuracy_plans],
        stage="accuracy",
        start=start,
        end=end,
        detail_prefix=detail_prefix,
        dense=prepared.dense_accuracy,
        order_seed=order_seed,
    )
    outcome.timings["accuracy_s"] = lap(started)
    return scored
