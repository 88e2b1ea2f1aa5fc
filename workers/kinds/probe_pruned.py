"""The pruned model a probe job compares with its dense model: pruned in the job (any method, its
own calibration), or loaded from a prune job's saved artifact and checked to be that model's
pruning (`workers.kinds.probe` runs the probes on the pair).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from sqlalchemy import select
from sqlalchemy.orm import Session
from transformers import PreTrainedModel

from core.methods import METHODS, UNSTRUCTURED, result_method
from core.specs.probe import ProbeJobCreate
from core.tables import Artifact, Job
from workers.context import JobContext, JobFailure
from workers.kinds.prune_steps import apply_method, check_prunable, draw_calibration, lap
from workers.loading import LoadedModel, ModelLoadError, load_copy, memory_plan, place
from workers.pruners import ARTIFACT_PRUNERS, PruneOptions, block_count, pruner_for


@dataclass
class PrunedModel:
    """The pruned side of a probe and where it came from."""

    model: PreTrainedModel
    method: str  # as stored in results, pattern included ("wanda-2:4")
    sparsity: float
    layer_map: list[int | None]  # dense block i -> its index in `model`; None: removed
    report: dict[str, Any]  # the slicing or pruning report
    origin: dict[str, Any]  # {"pruned_in_job": True} or the artifact job, kind and path
    timings: dict[str, float] = field(default_factory=dict)
    bases: list[torch.Tensor] | None = None  # sliced models: the kept directions per signal


def pruned_in_job(context: JobContext, spec: ProbeJobCreate, dense: LoadedModel) -> PrunedModel:
    """A second copy of the dense model, pruned here with the request's method and sparsity."""
    assert spec.method is not None and spec.sparsity is not None
    check_prunable(dense.model, spec.method)
    started = time.perf_counter()
    context.report("pruning", LOAD_END, "second copy of the model")
    try:
        copy = load_copy(dense)
    except ModelLoadError as error:
        raise JobFailure(str(error)) from error
    calibration, record = draw_calibration(context, copy, spec.calibration, spec.seed, spec.method)
    options = PruneOptions(
        pattern=spec.pattern,
        round_to=spec.round_to,
        batch_size=spec.calibration.batch_size,
        layout=spec.layout,
    )
    report = apply_method(
        context,
        copy.model,
        spec.method,
        spec.sparsity,
        calibration,
        options,
        device=copy.device,
        start=LOAD_END,
        end=PRUNE_END,
    )
    layer_map = pruner_for(spec.method).layer_map(report, block_count(dense.model))
    return PrunedModel(
        model=copy.model,
        method=METHODS[spec.method].stored_name(spec.pattern, spec.layout),
        sparsity=spec.sparsity,
        layer_map=layer_map,
        report={**report.to_dict(), "calibration": record},
        bases=getattr(report, "bases", None),
        origin={"pruned_in_job": True},
        timings={"pruning_s": lap(started)},
    )


def pruned_from_artifact(context: JobContext, spec: ProbeJobCreate, dense: LoadedModel) -> PrunedModel:
    """The model an earlier prune job saved (checked at submit; checked again here, since the
    artifact volume may have changed since)."""
    started = time.perf_counter()
    context.report("pruning", LOAD_END, f"artifact of job {spec.artifact_job_id}")
    job, artifact = context.read(
        partial(_artifact_of, job_id=str(spec.artifact_job_id)), "reading the artifact"
    )
    request = dict(job.request) if job is not None else {}
    pruner = ARTIFACT_PRUNERS.get(artifact.kind) if artifact is not None else None
    if artifact is None or pruner is None:
        raise JobFailure(f"job {spec.artifact_job_id} has no saved model to probe (save_artifact was off?)")
    folder = Path(artifact.path)
    if not folder.is_dir():
        raise JobFailure(f"the artifact folder {folder} of job {spec.artifact_job_id} is gone")
    method = result_method(
        str(request.get("method")), str(request.get("pattern", UNSTRUCTURED)), request.get("layout")
    )
    sparsity = float(request.get("sparsity", 0.0))
    origin = {"artifact_job_id": spec.artifact_job_id, "kind": artifact.kind, "path": str(folder)}
    try:
        reloaded = pruner.load(folder, torch.device("cpu"))  # placed below, beside the dense model
    except (OSError, ValueError, KeyError, SafetensorError) as error:  # the weights or the kept bases
        raise JobFailure(f"could not load the artifact of job {spec.artifact_job_id}: {error}") from error
    model, report, layer_map = reloaded.model, reloaded.report, reloaded.layer_map
    check_same_weights(dense, model, report.get("revision"), spec.artifact_job_id)
    as_module: torch.nn.Module = model  # PreTrainedModel.to's decorator confuses type checkers
    as_module.to(dtype=dense.dtype).eval()
    plan = dense.memory_plan
    try:  # planned against what the device has left with the dense model on it
        place(
            as_module, dense.device, memory_plan(as_module, dense.device, plan.mode, plan.configured_budget)
        )
    except ModelLoadError as error:
        raise JobFailure(str(error)) from error
    timings = {"load_pruned_s": lap(started)}
    return PrunedModel(model, method, sparsity, layer_map, report, origin, timings, reloaded.bases)


def _artifact_of(session: Session, *, job_id: str) -> tuple[Job | None, Artifact | None]:
    """The job that saved an artifact and its newest artifact row."""
    job = session.get(Job, job_id)
    artifact = session.scalars(
        select(Artifact).where(Artifact.job_id == job_id).order_by(Artifact.id.desc())
    ).first()
    return job, artifact


def check_same_weights(
    dense: LoadedModel, pruned: PreTrainedModel, revision: str | None, artifact_job_id: str | None
) -> None:
    """The dense model must be the one the artifact was pruned from, in the artifact's dtype: else
    unchanged weights would differ by rounding or revision and show up as pruning deviation."""
    if revision is not None and dense.revision is not None and revision != dense.revision:
        raise JobFailure(
            f"the artifact of job {artifact_job_id} was pruned from revision {revision}, but this probe "
            f"loaded revision {dense.revision}; set `revision` to {revision!r}"
        )
    stored = next(pruned.parameters()).dtype
    if stored != dense.dtype:
        name = str(stored).removeprefix("torch.")
        raise JobFailure(
            f"the artifact of job {artifact_job_id} holds {name} weights and the dense model was loaded "
            f"as {str(dense.dtype).removeprefix('torch.')}; set `dtype` to {name!r} so that unchanged "
            "weights compare equal"
        )


LOAD_END = 0.05


PRUNE_END = 0.35
