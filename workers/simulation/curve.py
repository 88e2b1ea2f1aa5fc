"""`simulate_curve`: every requested sparsity's simulated perplexity, and its anchors'."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch
from transformers import PreTrainedModel

from core.methods import METHODS, PROXY_MASK_METHOD, STOCK_LAYOUT, Simulation
from core.param_count import sliced_width
from workers.architectures import FamilyAdapter, detect_family, match_structure
from workers.block_inputs import BlockBatch, calibration_keep, capture_block_inputs, home_device
from workers.probing.head import Float32Head
from workers.pruning.recording import InputStatistic
from workers.pruning.rules import LINEAR_RULES
from workers.pruning.stream import PruningStopped
from workers.simulation.basis_regression import DenseReference
from workers.simulation.masking import MaskedTrack, Masking, simulate_masked
from workers.simulation.projection import (
    BasisStream,
    ProjectedTrack,
    Projection,
    simulate_projected,
    stock_basis,
)
from workers.simulation.streams import WindowScores, batches_holding, fork, score_windows, sequences
from workers.simulation.tracks import ANCHOR, SIMULATED, ProgressCallback, StopCheck, Track
from workers.simulation.whole_models import MaskedModel, ProjectedModel, SimulatedModel
from workers.slicing.engine import SlicingStopped, resolve_slice_head
from workers.slicing.fusion import hidden_width
from workers.slicing.stock import check_stock_family

SimulationStopped = (PruningStopped, SlicingStopped)
"""What a simulation raises when should_stop() asks (the model is never changed)."""


@dataclass(frozen=True)
class SimulatedPoint:
    sparsity: float
    role: str  # SIMULATED | ANCHOR
    width: int | None  # slicing's kept width d
    scores: WindowScores


@dataclass
class SimulationReport:
    """What a simulation computed, and how (for the job's results)."""

    method: str
    simulation: str  # core.methods.Simulation
    bases: str | None  # slicing: "sequential", "dense" or "stock"; None for the mask methods
    basis_windows: int | None  # sequential bases: calibration windows each sparsity's come from
    basis_estimator: str | None  # bases from a subset: "subset" or "regression"; every window: None
    family: str
    hidden_size: int
    num_layers: int
    calibration_tokens: int
    points: list[SimulatedPoint] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    models: list[SimulatedModel] = field(default_factory=list)  # `keep_models`: the face values, whole
    basis_dtype: str | None = None  # per-layer slicing: the dtype its basis streams ran in
    window_dtype: str | None = None  # to a precision: the dtype face values' further windows ran in
    dense_windows: dict[str, int] | None = None  # their dense corrections: windows scored, and reused
    pilot_on_copy: bool = False  # to a precision: the pilot ran with the further windows, not in the pass

    @property
    def windows_on_copy(self) -> bool:
        """Whether face values' windows ran on a copy in another dtype (then not the method exactly)."""
        return self.dense_windows is not None


@dataclass(frozen=True)
class SimulationOptions:
    """How to simulate (the job's request fields of the same names)."""

    layout: str | None = None  # slicing: None or "per-layer", or "stock"
    bases: str = "sequential"  # per-layer slicing: "sequential" or "dense" (`projection` says which is what)
    basis_windows: int | None = None  # sequential bases: the first N calibration windows (None: all)
    basis_estimator: str = "subset"  # sequential bases from fewer windows: "subset" or "regression"
    streams_dtype: torch.dtype | None = None  # per-layer slicing's calibration streams (None: the model's)
    round_to: int = 8  # slicing's kept width d rounded down to a multiple of this
    slice_head: bool | None = None  # slicing: project the last block output too (None: the family's default)
    calibration_batch_size: int = 8  # calibration windows per block call
    eval_batch_size: int = 1  # evaluation windows per block call
    keep_models: bool = False  # keep each face value's bases or statistics as a whole model (tasks)


@torch.no_grad()
def simulate_curve(
    model: PreTrainedModel,
    method: str,
    eval_ids: torch.Tensor,
    sparsities: Sequence[float],
    *,
    anchors: Sequence[float] = (),
    calibration_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    options: SimulationOptions = SimulationOptions(),
    device: torch.device | str | None = None,
    progress: ProgressCallback | None = None,
    should_stop: StopCheck | None = None,
) -> SimulationReport:
    """Simulate `method` at `sparsities` and at `anchors` (an anchor scales the face value at its own
    sparsity), and run the method itself at `anchors`, on the evaluation windows `eval_ids` (W, T),
    calibrated on `calibration_ids` (N, T) when the method reads data. Where the simulation is the
    method itself (`Method.simulates_exactly`) an anchor is its face value, not a second pass. The
    model is not changed. ValueError (UnsupportedArchitectureError included) for what cannot be simulated;
    `SimulationStopped` when should_stop() asks, checked before each block."""
    started = time.perf_counter()
    entry = METHODS[method]
    if entry.simulation is None:
        raise ValueError(f"method {method!r} has no simulation; prune it instead")
    if eval_ids.dim() != 2 or eval_ids.shape[1] < 2:
        raise ValueError(f"eval_ids must be (W, T) with T >= 2, got shape {tuple(eval_ids.shape)}")
    model.eval()
    home = home_device(model)
    compute = torch.device(device) if device is not None else home
    slicing = entry.simulation is Simulation.projection
    adapter = detect_family(model) if slicing else match_structure(model)
    calibration: list[BlockBatch] = []
    calibration_tokens = 0
    if entry.calibrated:
        if calibration_ids is None:
            raise ValueError(f"method {method!r} reads calibration data; pass calibration_ids")
        keep = calibration_keep(calibration_ids, attention_mask, options.calibration_batch_size)
        calibration_tokens = int(keep.sum())
        calibration = capture_block_inputs(
            model, adapter, calibration_ids, keep, options.calibration_batch_size, compute, home
        )
    evaluation = capture_block_inputs(
        model,
        adapter,
        eval_ids,
        torch.ones_like(eval_ids, dtype=torch.bool),
        options.eval_batch_size,
        compute,
        home,
    )
    report = SimulationReport(
        method=method,
        simulation=entry.simulation.value,
        bases=None,
        basis_windows=None,
        basis_estimator=None,
        family=adapter.name,
        hidden_size=hidden_width(model, adapter),
        num_layers=len(adapter.blocks(model)),
        calibration_tokens=calibration_tokens,
    )
    report.timings["capture"] = time.perf_counter() - started
    faces = sorted({*sparsities, *anchors})
    exact = entry.simulates_exactly(options.layout)
    passes = () if exact else anchors  # anchors that need the method's own pass
    if slicing:
        tracks: list[Track] = _simulate_slicing(
            model,
            adapter,
            report,
            evaluation,
            calibration,
            faces,
            passes,
            options,
            compute,
            home,
            progress,
            should_stop,
        )
        if options.keep_models:
            report.models += [
                ProjectedModel(track.sparsity, adapter, track.width, track.kept_bases)
                for track in tracks
                if isinstance(track, ProjectedTrack) and track.kept_bases is not None
            ]
    else:
        tracks = _simulate_masks(
            model,
            adapter,
            entry.simulation,
            method,
            evaluation,
            calibration,
            faces,
            passes,
            compute,
            home,
            progress,
            should_stop,
            report if options.keep_models else None,
        )
    passes_done = time.perf_counter()
    report.timings["passes"] = passes_done - started - report.timings["capture"]
    head = Float32Head(adapter, model, compute)
    for track in tracks:
        width = track.width if isinstance(track, ProjectedTrack) else None
        report.points.append(
            SimulatedPoint(track.sparsity, track.role, width, score_windows(head, track.batches, eval_ids))
        )
        track.batches.clear()
    if exact:
        report.points += [replace(point, role=ANCHOR) for point in report.points if point.sparsity in anchors]
    report.timings["scoring"] = time.perf_counter() - passes_done
    report.timings["total"] = time.perf_counter() - started
    return report


def _simulate_slicing(
    model: PreTrainedModel,
    adapter: FamilyAdapter,
    report: SimulationReport,
    evaluation: list[BlockBatch],
    calibration: list[BlockBatch],
    sparsities: Sequence[float],
    anchors: Sequence[float],
    options: SimulationOptions,
    compute: torch.device,
    home: torch.device,
    progress: ProgressCallback | None,
    should_stop: StopCheck | None,
) -> list[Track]:
    full = report.hidden_size
    stock = options.layout == STOCK_LAYOUT
    if stock:
        check_stock_family(model, adapter)
    projection = Projection(
        adapter=adapter,
        full=full,
        centred=adapter.uses_layernorm,
        slice_head=True if stock else resolve_slice_head(adapter.name, options.slice_head),
        compute=compute,
        home=home,
        streams_dtype=options.streams_dtype,
    )
    if stock:
        report.bases = "stock"
        shared = stock_basis(model, projection, calibration, _half(progress, 0), should_stop)
        projection, progress = replace(projection, shared=shared), _half(progress, 1)
        streams: list[BasisStream] = []
        sources: list[tuple[float, str, BasisStream | None]] = [(s, SIMULATED, None) for s in sparsities]
        sources += [(s, ANCHOR, None) for s in anchors]
    else:
        report.bases = options.bases
        report.basis_dtype = str(options.streams_dtype or model.dtype).removeprefix("torch.")
        streams, sources = _per_layer_streams(calibration, sparsities, anchors, options, full)
        if options.bases != "dense":  # whole batches: the windows the sequential streams hold
            report.basis_windows = sequences(
                calibration[: batches_holding(calibration, options.basis_windows)]
            )
            if report.basis_windows < sequences(calibration):
                report.basis_estimator = options.basis_estimator
    tracks = [
        ProjectedTrack(
            s,
            role,
            fork(evaluation),
            width=sliced_width(full, s, options.round_to),
            source=source,
            kept_bases=[] if options.keep_models and role == SIMULATED else None,
        )
        for s, role, source in sources
    ]
    calibration.clear()
    evaluation.clear()
    report.timings["bases"] = simulate_projected(model, projection, streams, tracks, progress, should_stop)
    return list(tracks)


def _per_layer_streams(
    calibration: list[BlockBatch],
    sparsities: Sequence[float],
    anchors: Sequence[float],
    options: SimulationOptions,
    full: int,
) -> tuple[list[BasisStream], list[tuple[float, str, BasisStream | None]]]:
    """The calibration streams of per-layer slicing, and each track's: one dense stream for `dense`
    bases; for `sequential` ones a stream per sparsity over the first `basis_windows`, projected at its
    width (with the `regression` estimator, all of them corrected by one dense reference stream over
    every window when the subset is fewer); an anchor's over every window."""
    streams: list[BasisStream] = []
    sources: list[tuple[float, str, BasisStream | None]] = []
    if options.bases == "dense":
        shared = BasisStream(fork(calibration), None)
        streams.append(shared)
        sources += [(s, SIMULATED, shared) for s in sparsities]
    else:
        subset = calibration[: batches_holding(calibration, options.basis_windows)]
        reference = None
        if options.basis_estimator == "regression" and len(subset) < len(calibration):
            reference = DenseReference(fork(calibration), subset=len(subset))
        for sparsity in sparsities:
            width = sliced_width(full, sparsity, options.round_to)
            streams.append(BasisStream(fork(subset), width, reference=reference))
            sources.append((sparsity, SIMULATED, streams[-1]))
    for sparsity in anchors:
        width = sliced_width(full, sparsity, options.round_to)
        streams.append(BasisStream(fork(calibration), width, model_dtype=True))
        sources.append((sparsity, ANCHOR, streams[-1]))
    return streams, sources


def _simulate_masks(
    model: PreTrainedModel,
    adapter: FamilyAdapter,
    simulation: Simulation,
    method: str,
    evaluation: list[BlockBatch],
    calibration: list[BlockBatch],
    sparsities: Sequence[float],
    anchors: Sequence[float],
    compute: torch.device,
    home: torch.device,
    progress: ProgressCallback | None,
    should_stop: StopCheck | None,
    report: SimulationReport | None,
) -> list[Track]:
    """The mask methods' tracks run; with `report`, each face value kept in it as a whole model."""
    own = LINEAR_RULES[method]
    face = own if simulation is Simulation.own_mask else LINEAR_RULES[PROXY_MASK_METHOD]
    tracks = [MaskedTrack(sparsity, SIMULATED, fork(evaluation)) for sparsity in sparsities]
    for sparsity in anchors:
        own_stream = fork(calibration) if own.statistic is not None else None
        tracks.append(MaskedTrack(sparsity, ANCHOR, fork(evaluation), calibration=own_stream))
    evaluation.clear()
    dense = calibration if face.statistic is not None else []
    masking = Masking(adapter=adapter, face=face, own=own, compute=compute, home=home)
    kept: list[dict[str, InputStatistic] | None] | None = None if report is None else []
    simulate_masked(model, masking, dense, tracks, progress, should_stop, kept)
    calibration.clear()
    if report is not None and kept is not None:
        report.models += [MaskedModel(s, adapter, face, kept, compute) for s in sparsities]
    return list(tracks)


def _half(progress: ProgressCallback | None, which: int) -> ProgressCallback | None:
    """Two passes over the blocks reported as one count: the first half, then the second."""
    if progress is None:
        return None

    def report(done: int, total: int) -> None:
        progress(which * total + done, 2 * total)

    return report
