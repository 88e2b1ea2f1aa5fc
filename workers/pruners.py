"""The engine side of the method registry: for each kind of method (`core.methods.MethodKind`) the
engine that checks, prunes, describes, saves and reloads its models.

Jobs never compare method names: they look the method up in `core.methods` and its pruner here.
SliceGPT (`workers.slicing`) makes a narrower model in its own format; the other methods
(`workers.pruning`) keep the architecture and save stock transformers checkpoints.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from transformers import PreTrainedModel

from core.methods import METHODS, PRUNED_ARTIFACT, SLICED_ARTIFACT, STOCK_LAYOUT, Method, MethodKind
from workers.architectures import detect_family, match_structure
from workers.pruning import PruningReport, PruningStopped, load_pruned, prune_model, save_pruned
from workers.slicing.artifacts import WEIGHTS_FILE, load_bases, load_sliced, read_slicing_config, save_sliced
from workers.slicing.engine import SlicingStopped, slice_model
from workers.slicing.report import SlicingReport
from workers.slicing.stock import slice_model_stock

Report = SlicingReport | PruningReport
ProgressCallback = Callable[[int, int], None]  # (blocks done, blocks)
StopCheck = Callable[[], bool]  # True: stop before the next block


@dataclass(frozen=True)
class PruneOptions:
    """The request fields a pruning reads (each method reads the ones it knows)."""

    pattern: str = "unstructured"
    round_to: int = 8
    slice_head: bool | None = None
    batch_size: int = 8
    layout: str | None = None  # slicing: core.methods layouts; None is the per-layer default
    keep_bases: bool = True  # slicing: keep (and save) the kept directions of every signal


@dataclass(frozen=True)
class PruneRun:
    """What one pruning works with besides the model: the calibration windows (None for data-free
    methods), the request's options, where to compute, and how to report and stop."""

    calibration_ids: torch.Tensor | None  # (N, T)
    attention_mask: torch.Tensor | None  # (N, T), 1 = real token
    options: PruneOptions
    device: torch.device
    progress: ProgressCallback
    should_stop: StopCheck


@dataclass(frozen=True)
class Reloaded:
    """A pruned model read back from its artifact, for probing against its dense model."""

    model: PreTrainedModel
    report: dict[str, Any]  # the slicing or pruning report the artifact carries
    layer_map: list[int | None]  # dense block i -> its index in the model; None: removed
    bases: list[torch.Tensor] | None = None  # sliced models: SlicingReport.bases, where the folder kept them


class Pruner(Protocol):
    artifact_kind: str
    stopped: tuple[type[Exception], ...]  # what the engine raises when told to stop

    def check(self, model: PreTrainedModel) -> None:
        """Raise UnsupportedArchitectureError if the engine cannot prune this model."""

    def prune(self, model: PreTrainedModel, method: Method, sparsity: float, run: PruneRun) -> Report:
        """Prune `model` in place; ValueError for bad arguments."""

    def describe(self, report: Report) -> dict[str, Any]:
        """What the `param_fraction_removed` result records about the pruned model's shape and size."""

    def shape(self, report: Report) -> dict[str, Any]:
        """The one-line shape an accuracy result carries."""

    def layer_map(self, report: Report, num_layers: int) -> list[int | None]:
        """Dense block i -> its index in the pruned model (None: removed)."""

    def save(
        self,
        model: PreTrainedModel,
        report: Report,
        folder: Path,
        *,
        model_id: str,
        revision: str | None,
        calibration: dict[str, Any] | None,
    ) -> Path:
        """Write the pruned model to `folder`; the file whose hash identifies it."""

    def load(self, folder: Path, device: torch.device) -> Reloaded:
        """Read a model this pruner saved."""


class SlicingPruner:
    """SliceGPT: rotate every residual signal onto its principal components and cut the width."""

    artifact_kind = SLICED_ARTIFACT
    stopped: tuple[type[Exception], ...] = (SlicingStopped,)

    def check(self, model: PreTrainedModel) -> None:
        detect_family(model)  # the full family checks: rotation-invariant norms...

    def prune(self, model: PreTrainedModel, method: Method, sparsity: float, run: PruneRun) -> Report:
        if run.calibration_ids is None:
            raise ValueError("slicing needs calibration windows")
        common: dict[str, Any] = {
            "round_to": run.options.round_to,
            "batch_size": run.options.batch_size,
            "device": run.device,
            "keep_bases": run.options.keep_bases,
            "progress": run.progress,
            "should_stop": run.should_stop,
        }
        if run.options.layout == STOCK_LAYOUT:
            return slice_model_stock(model, run.calibration_ids, run.attention_mask, sparsity, **common)
        return slice_model(
            model,
            run.calibration_ids,
            run.attention_mask,
            sparsity,
            slice_head=run.options.slice_head,
            **common,
        )

    def describe(self, report: Report) -> dict[str, Any]:
        assert isinstance(report, SlicingReport)
        return {
            "params_before": report.params_before,
            "params_after": report.params_after,
            "predicted_params_before": report.predicted_params_before,
            "predicted_params_after": report.predicted_params_after,
            "family": report.family,
            "hidden_size": report.hidden_size,
            "width": report.width,
            "round_to": report.round_to,
            "slice_head": report.slice_head,
            "layout": report.layout,
            "pooling": report.pooling,
            "dtype": report.dtype,
        }

    def shape(self, report: Report) -> dict[str, Any]:
        assert isinstance(report, SlicingReport)
        return {"width": report.width, "layout": report.layout}

    def layer_map(self, report: Report, num_layers: int) -> list[int | None]:
        return list(range(num_layers))  # every block stays, narrower

    def save(
        self,
        model: PreTrainedModel,
        report: Report,
        folder: Path,
        *,
        model_id: str,
        revision: str | None,
        calibration: dict[str, Any] | None,
    ) -> Path:
        assert isinstance(report, SlicingReport) and calibration is not None
        save_sliced(
            model, report, folder, source_model_id=model_id, revision=revision, calibration=calibration
        )
        return folder / str(read_slicing_config(folder)["weights_file"])

    def load(self, folder: Path, device: torch.device) -> Reloaded:
        model = load_sliced(folder, device=device)
        layer_map: list[int | None] = list(range(block_count(model)))
        return Reloaded(model, read_slicing_config(folder), layer_map, bases=load_bases(folder))


class WeightPruner:
    """Intra-layer sparsity and layer drops: the architecture stays, weights or blocks go."""

    artifact_kind = PRUNED_ARTIFACT
    stopped: tuple[type[Exception], ...] = (PruningStopped,)

    def check(self, model: PreTrainedModel) -> None:
        match_structure(model)  # only the block structure matters

    def prune(self, model: PreTrainedModel, method: Method, sparsity: float, run: PruneRun) -> Report:
        return prune_model(
            model,
            method.name,
            sparsity,
            pattern=run.options.pattern,
            calibration_ids=run.calibration_ids,
            attention_mask=run.attention_mask,
            batch_size=run.options.batch_size,
            device=run.device,
            progress=run.progress,
            should_stop=run.should_stop,
        )

    def describe(self, report: Report) -> dict[str, Any]:
        return {key: value for key, value in report.to_dict().items() if key not in ("scores", "timings")}

    def shape(self, report: Report) -> dict[str, Any]:
        assert isinstance(report, PruningReport)
        return {"achieved_sparsity": report.achieved_sparsity, "dropped_layers": report.dropped_layers}

    def layer_map(self, report: Report, num_layers: int) -> list[int | None]:
        assert isinstance(report, PruningReport)
        return list(report.layer_map)

    def save(
        self,
        model: PreTrainedModel,
        report: Report,
        folder: Path,
        *,
        model_id: str,
        revision: str | None,
        calibration: dict[str, Any] | None,
    ) -> Path:
        assert isinstance(report, PruningReport)
        save_pruned(
            model, report, folder, model_id=model_id, revision=revision, calibration_record=calibration
        )
        weights = folder / WEIGHTS_FILE
        return weights if weights.exists() else folder / f"{WEIGHTS_FILE}.index.json"  # sharded: the index

    def load(self, folder: Path, device: torch.device) -> Reloaded:
        model, report = load_pruned(folder)
        return Reloaded(model, report, list(report["layer_map"]))


PRUNERS: dict[MethodKind, Pruner] = {
    MethodKind.slicing: SlicingPruner(),
    MethodKind.intra_layer: WeightPruner(),
    MethodKind.drop: WeightPruner(),
}
ARTIFACT_PRUNERS: dict[str, Pruner] = {pruner.artifact_kind: pruner for pruner in PRUNERS.values()}


def pruner_for(method: str) -> Pruner:
    return PRUNERS[METHODS[method].kind]


def block_count(model: PreTrainedModel) -> int:
    return len(match_structure(model).blocks(model))
