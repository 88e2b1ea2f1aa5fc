"""Steps of the kinds that slice a model (`prune`, `sweep`): load a model that can be sliced,
measure or reuse its dense baseline, draw the calibration windows, slice one dense copy at one
sparsity and measure it, and the result rows that describe it.

A `prune` job runs `prepare` and then `slice_and_measure` once. A `sweep` runs `prepare` once and
`slice_and_measure` once per sparsity, each on a fresh dense copy (`workers.loading.reload_model`)
with the same calibration windows, so a sweep stores, point for point, the results a `prune` job
with the same request fields would store.
"""

from __future__ import annotations

import hashlib
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel

from app.model_sources import ModelSource
from app.schemas import AccuracySpec, PruneJobCreate, SweepJobCreate
from app.tables import Artifact, Result
from workers.accuracy import TaskResult
from workers.calibration import CalibrationBatch, CalibrationError, build_calibration, calibration_corpus
from workers.context import JobContext, JobFailure
from workers.data import DataMissingError
from workers.environment import run_environment
from workers.evaluate import PerplexityResult, effective_seqlen
from workers.kinds.accuracy_steps import (
    DenseAccuracy,
    TaskPlan,
    accuracy_results,
    dense_accuracy,
    measure_accuracy,
    plan_tasks,
)
from workers.kinds.steps import (
    PerplexityData,
    dense_baseline,
    load_for_job,
    measure_perplexity,
    perplexity_data,
    perplexity_protocol,
    step_reporter,
)
from workers.loading import LoadedModel
from workers.slicing.adapters import UnsupportedArchitectureError, detect_family
from workers.slicing.artifacts import WEIGHTS_FILE, save_sliced
from workers.slicing.engine import SlicingReport, SlicingStopped, slice_model

ARTIFACT_KIND = "sliced-model"
# Results that describe the model rather than a measurement on data carry this dataset name.
NO_DATASET = "none"

SlicingJob = PruneJobCreate | SweepJobCreate

# How `slice_and_measure` splits its share of the job's progress: slicing, saving, perplexity.
# (A prune job gives it 0.30-1.00: slicing 0.30-0.75, saving 0.75-0.80, perplexity 0.80-1.00.)
SLICING_SHARE = 45 / 70
SAVING_SHARE = 5 / 70


@dataclass(frozen=True)
class PrepareSpans:
    """Where `prepare`'s stages sit in the job's progress (0..1)."""

    load: float
    baseline: tuple[float, float]
    calibration: tuple[float, float]


@dataclass
class Prepared:
    """What every sparsity of a slicing job is sliced and scored with, measured or drawn once."""

    source: ModelSource
    loaded: LoadedModel  # the dense model (the first sparsity may slice it in place) and tokenizer
    environment: dict[str, Any]
    data: PerplexityData
    dense: Result
    dense_reused: bool  # measured by another job
    calibration: CalibrationBatch
    calibration_record: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)
    accuracy_plans: list[TaskPlan] = field(default_factory=list)  # empty: no accuracy asked
    dense_accuracy: dict[str, DenseAccuracy] = field(default_factory=dict)  # task -> its dense rows


@dataclass(frozen=True)
class Measured:
    """One sliced model, scored."""

    sparsity: float
    report: SlicingReport
    perplexity: PerplexityResult
    artifact_path: str | None
    timings: dict[str, float]


def lap(since: float) -> float:
    return round(time.perf_counter() - since, 3)


def prepare(
    context: JobContext, spec: SlicingJob, spans: PrepareSpans, accuracy: AccuracySpec | None = None
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
        detect_family(loaded.model)  # refuse before spending time on the dense baseline
    except UnsupportedArchitectureError as error:
        raise JobFailure(str(error)) from error
    environment = run_environment(loaded.device)
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
    calibration_spec = spec.calibration
    context.report("calibration", spans.calibration[0], calibration_spec.corpus)
    try:
        corpus = calibration_corpus(calibration_spec.corpus, calibration_spec.text, context.settings)
        calibration = build_calibration(
            loaded.tokenizer,
            corpus,
            num_sequences=calibration_spec.num_sequences,
            seqlen=effective_seqlen(loaded.model, calibration_spec.seqlen),
            seed=spec.seed if calibration_spec.seed is None else calibration_spec.seed,
            settings=context.settings,
            requested_seqlen=calibration_spec.seqlen,
        )
    except (DataMissingError, CalibrationError) as error:
        raise JobFailure(str(error)) from error
    timings["calibration_s"] = lap(lap_started)
    return Prepared(
        source=source,
        loaded=loaded,
        environment=environment,
        data=data,
        dense=dense,
        dense_reused=reused,
        calibration=calibration,
        calibration_record={**calibration.record, "batch_size": calibration_spec.batch_size},
        timings=timings,
        accuracy_plans=plans,
        dense_accuracy=dense_acc,
    )


def slice_and_measure(
    context: JobContext,
    prepared: Prepared,
    model: PreTrainedModel,
    spec: SlicingJob,
    sparsity: float,
    *,
    start: float,
    end: float,
    artifact_folder: Path | None,
    detail_prefix: str = "",
) -> Measured:
    """Slice the dense `model` in place at `sparsity`, save it to `artifact_folder` (recorded as an
    artifact of the job) when given, and score it, reporting progress within [start, end].

    Stops with JobStopped at a safe point (before a block, before a window) when the job must stop;
    the partly sliced model must then be discarded.
    """
    slicing_end = start + (end - start) * SLICING_SHARE
    saving_end = slicing_end + (end - start) * SAVING_SHARE
    timings: dict[str, float] = {}
    lap_started = time.perf_counter()
    try:
        report = slice_model(
            model,
            prepared.calibration.input_ids,
            prepared.calibration.attention_mask,
            sparsity,
            round_to=spec.round_to,
            batch_size=spec.calibration.batch_size,
            device=prepared.loaded.device,
            slice_head=spec.slice_head,
            progress=step_reporter(context, "slicing", start, slicing_end, "block", detail_prefix),
            should_stop=context.should_stop,
        )
    except SlicingStopped:
        context.check_stop()
        raise
    except ValueError as error:  # UnsupportedArchitectureError included
        raise JobFailure(f"slicing: {error}") from error
    timings["slicing_s"] = lap(lap_started)

    artifact_path: str | None = None
    if artifact_folder is not None:
        lap_started = time.perf_counter()
        context.report("saving", slicing_end, f"{detail_prefix}sliced model")
        artifact = save_artifact(
            model,
            report,
            artifact_folder,
            prepared.source.model_id,
            prepared.loaded.revision,
            prepared.calibration_record,
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
    )
    timings["perplexity_s"] = lap(lap_started)
    return Measured(sparsity, report, measured, artifact_path, timings)


def score_sliced_accuracy(
    context: JobContext,
    prepared: Prepared,
    accuracy: AccuracySpec | None,
    outcome: Measured,
    *,
    start: float,
    end: float,
    detail_prefix: str = "",
) -> list[TaskResult]:
    """Score the sliced model on the prepared tasks (none when the job asked for no accuracy)."""
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
    )
    outcome.timings["accuracy_s"] = lap(started)
    return scored


def pruned_results(
    prepared: Prepared,
    spec: SlicingJob,
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
        "slicing": report.to_dict(),
        "artifact": outcome.artifact_path,
        "timings": timings,
        **(extra_protocol or {}),
        **prepared.environment,
    }
    return [
        Result(
            model_id=prepared.source.model_id,
            model_revision=loaded.revision,
            method=spec.method,
            sparsity=outcome.sparsity,
            metric="ppl",
            dataset=prepared.data.spec.dataset,
            split=prepared.data.corpus.split,
            value=outcome.perplexity.ppl,
            n=outcome.perplexity.tokens_scored,
            source="measured",
            protocol=protocol,
        ),
        Result(
            model_id=prepared.source.model_id,
            model_revision=loaded.revision,
            method=spec.method,
            sparsity=outcome.sparsity,
            metric="param_fraction_removed",
            dataset=NO_DATASET,
            value=report.param_fraction_removed,
            source="measured",
            protocol={
                "params_before": report.params_before,
                "params_after": report.params_after,
                "predicted_params_before": report.predicted_params_before,
                "predicted_params_after": report.predicted_params_after,
                "family": report.family,
                "hidden_size": report.hidden_size,
                "width": report.width,
                "round_to": report.round_to,
                "slice_head": report.slice_head,
                "dtype": report.dtype,
                **(extra_protocol or {}),
                **prepared.environment,
            },
        ),
    ]


def pruned_accuracy_results(
    prepared: Prepared,
    spec: SlicingJob,
    outcome: Measured,
    scored: list[TaskResult],
    *,
    extra_protocol: dict[str, Any] | None = None,
) -> list[Result]:
    """The rows of a sliced model's accuracy: per task and metric (see `accuracy_steps`), each
    with the dense result it compares with, the calibration record, the kept width and the
    artifact, then `extra_protocol`."""
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
                "width": outcome.report.width,
                "param_fraction_removed": outcome.report.param_fraction_removed,
                "artifact": outcome.artifact_path,
                **(extra_protocol or {}),
            }
            for metric, row in dense.results.items()
        }
        rows += accuracy_results(
            measured,
            source=prepared.source,
            loaded=prepared.loaded,
            method=spec.method,
            sparsity=outcome.sparsity,
            seed=spec.seed,
            environment=prepared.environment,
            extra_protocol=per_metric,
        )
    return rows


def save_artifact(
    model: PreTrainedModel,
    report: SlicingReport,
    folder: Path,
    model_id: str,
    revision: str | None,
    calibration: dict[str, Any],
) -> Artifact:
    """Write the sliced model to `folder` (replacing what an earlier attempt left) and describe it."""
    if folder.exists():
        shutil.rmtree(folder)
    save_sliced(model, report, folder, source_model_id=model_id, revision=revision, calibration=calibration)
    total_bytes = sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())
    return Artifact(
        kind=ARTIFACT_KIND, path=str(folder), bytes=total_bytes, sha256=file_sha256(folder / WEIGHTS_FILE)
    )


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
