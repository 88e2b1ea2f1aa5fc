"""`prune` jobs: prune a model with a method at a sparsity, save it, measure it.

Stages and the share of the job's progress each one covers:

    loading model   0.00-0.05
    dense baseline  0.05-0.25  reused from the store when the same model, data and perplexity
                               protocol were measured before; else measured and stored (dense, 0)
    calibration     0.25-0.30  seeded windows of the calibration corpus
    slicing         0.30-0.75  detail "block i/L"
    saving          0.75-0.80  the sliced model under <artifacts dir>/<job id>/, recorded in `artifacts`
    perplexity      0.80-1.00  detail "window i/W"

Results: `ppl` of the pruned model (method, requested sparsity; protocol = perplexity protocol +
calibration record + slicing report + timings + versions) and `param_fraction_removed` (the real
fraction of parameters removed, which differs from the sparsity of the residual width).
"""

from __future__ import annotations

import hashlib
import shutil
import time
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel

from app.schemas import PruneJobCreate
from app.tables import Artifact, Result
from workers.calibration import CalibrationError, build_calibration, calibration_corpus
from workers.context import JobContext, JobFailure
from workers.data import DataMissingError, load_wikitext2_test, tokenize_corpus
from workers.environment import run_environment
from workers.evaluate import effective_seqlen
from workers.kinds.steps import (
    dtype_name,
    find_dense_baseline,
    load_for_job,
    measure_perplexity,
    perplexity_protocol,
    step_reporter,
)
from workers.slicing.adapters import UnsupportedArchitectureError, detect_family
from workers.slicing.artifacts import WEIGHTS_FILE, save_sliced
from workers.slicing.engine import SlicingReport, SlicingStopped, slice_model

ARTIFACT_KIND = "sliced-model"
# Results that describe the model rather than a measurement on data carry this dataset name.
NO_DATASET = "none"


def run(context: JobContext) -> None:
    spec = PruneJobCreate.model_validate(context.request)
    settings = context.settings
    timings: dict[str, float] = {}
    started = time.perf_counter()

    context.report("loading model", 0.02, spec.model)
    source, loaded = load_for_job(context, spec)
    try:
        detect_family(loaded.model)  # refuse before spending time on the dense baseline
    except UnsupportedArchitectureError as error:
        raise JobFailure(str(error)) from error
    environment = run_environment(loaded.device)
    context.set_environment(environment)
    timings["load_s"] = _lap(started)

    # Dense baseline: measured once per model and protocol, then reused (sweep-friendly).
    lap = time.perf_counter()
    ppl_spec = spec.perplexity
    context.report("dense baseline", 0.05, ppl_spec.dataset)
    try:
        eval_corpus = load_wikitext2_test(settings)
    except DataMissingError as error:
        raise JobFailure(str(error)) from error
    eval_ids = tokenize_corpus(loaded.tokenizer, eval_corpus, settings=settings)
    eval_seqlen = effective_seqlen(loaded.model, ppl_spec.seqlen)
    wanted = {  # steps.BASELINE_MATCH_KEYS
        "seqlen": eval_seqlen,
        "max_windows": ppl_spec.max_windows,
        "data_sha256": eval_corpus.sha256,
        "dtype": dtype_name(loaded.dtype),
    }
    dense = find_dense_baseline(context.store, source.model_id, loaded.revision, ppl_spec.dataset, wanted)
    if dense is not None:
        context.report("dense baseline", 0.25, f"reused result {dense.id}")
    else:
        measured = measure_perplexity(
            context,
            loaded.model,
            eval_ids,
            ppl_spec,
            eval_seqlen,
            stage="dense baseline",
            start=0.05,
            end=0.25,
        )
        dense = Result(
            model_id=source.model_id,
            model_revision=loaded.revision,
            method="dense",
            sparsity=0.0,
            metric="ppl",
            dataset=ppl_spec.dataset,
            split=eval_corpus.split,
            value=measured.ppl,
            n=measured.tokens_scored,
            source="measured",
            protocol={
                **perplexity_protocol(measured, ppl_spec, eval_corpus, loaded.dtype, spec.seed),
                **environment,
            },
        )
        context.add_results([dense])
    dense_reused = dense.job_id != context.job_id
    timings["dense_baseline_s"] = _lap(lap)

    # Calibration windows.
    lap = time.perf_counter()
    calibration_spec = spec.calibration
    context.report("calibration", 0.25, calibration_spec.corpus)
    calibration_seqlen = effective_seqlen(loaded.model, calibration_spec.seqlen)
    try:
        corpus = calibration_corpus(calibration_spec.corpus, calibration_spec.text, settings)
        calibration = build_calibration(
            loaded.tokenizer,
            corpus,
            num_sequences=calibration_spec.num_sequences,
            seqlen=calibration_seqlen,
            seed=spec.seed if calibration_spec.seed is None else calibration_spec.seed,
            settings=settings,
            requested_seqlen=calibration_spec.seqlen,
        )
    except (DataMissingError, CalibrationError) as error:
        raise JobFailure(str(error)) from error
    calibration_record = {**calibration.record, "batch_size": calibration_spec.batch_size}
    timings["calibration_s"] = _lap(lap)

    # Slicing, block by block.
    lap = time.perf_counter()
    try:
        report = slice_model(
            loaded.model,
            calibration.input_ids,
            calibration.attention_mask,
            spec.sparsity,
            round_to=spec.round_to,
            batch_size=calibration_spec.batch_size,
            device=loaded.device,
            slice_head=spec.slice_head,
            progress=step_reporter(context, "slicing", 0.30, 0.75, "block"),
            should_stop=context.should_stop,
        )
    except SlicingStopped:
        context.check_stop()
        raise
    except ValueError as error:  # UnsupportedArchitectureError included
        raise JobFailure(f"slicing: {error}") from error
    del calibration
    timings["slicing_s"] = _lap(lap)

    artifact_path: str | None = None
    if spec.save_artifact:
        lap = time.perf_counter()
        context.report("saving", 0.75, "sliced model")
        folder = settings.artifacts_dir / context.job_id
        artifact = _save_artifact(
            loaded.model, report, folder, source.model_id, loaded.revision, calibration_record
        )
        context.add_artifacts([artifact])
        artifact_path = artifact.path
        timings["save_s"] = _lap(lap)

    lap = time.perf_counter()
    context.report("perplexity", 0.80, ppl_spec.dataset)
    measured = measure_perplexity(
        context, loaded.model, eval_ids, ppl_spec, eval_seqlen, stage="perplexity", start=0.80, end=1.0
    )
    timings["perplexity_s"] = _lap(lap)
    timings["total_s"] = _lap(started)

    slicing = report.to_dict()
    protocol: dict[str, Any] = {
        **perplexity_protocol(measured, ppl_spec, eval_corpus, loaded.dtype, spec.seed),
        "method": spec.method,
        "dense_result_id": dense.id,
        "dense_ppl": dense.value,
        "dense_reused": dense_reused,
        "calibration": calibration_record,
        "slicing": slicing,
        "artifact": artifact_path,
        "timings": timings,
        **environment,
    }
    context.add_results(
        [
            Result(
                model_id=source.model_id,
                model_revision=loaded.revision,
                method=spec.method,
                sparsity=spec.sparsity,
                metric="ppl",
                dataset=ppl_spec.dataset,
                split=eval_corpus.split,
                value=measured.ppl,
                n=measured.tokens_scored,
                source="measured",
                protocol=protocol,
            ),
            Result(
                model_id=source.model_id,
                model_revision=loaded.revision,
                method=spec.method,
                sparsity=spec.sparsity,
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
                    **environment,
                },
            ),
        ]
    )
    context.log.info(
        "prune finished",
        method=spec.method,
        sparsity=spec.sparsity,
        dense_ppl=dense.value,
        ppl=measured.ppl,
        param_fraction_removed=report.param_fraction_removed,
        total_s=timings["total_s"],
    )


def _lap(since: float) -> float:
    return round(time.perf_counter() - since, 3)


def _save_artifact(
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
        kind=ARTIFACT_KIND, path=str(folder), bytes=total_bytes, sha256=_file_sha256(folder / WEIGHTS_FILE)
    )


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
