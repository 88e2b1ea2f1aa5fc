"""SliceGPT simulated: the dense model with every residual signal projected on its basis' top-d span.

Why this is the sliced model (docs/science.md §2, "Simulated curves"): a sliced block reads its
input x_d = x Q[:, :d] through a norm whose constant keeps the original width, which sees exactly
what the dense norm sees of the projection P x = x Q_d Q_dᵀ; its writers add branch outputs rotated
and cut to the next basis' d directions, so the next signal is P'(P x + branch(P x)). Running the
dense blocks (norms folded or not: the readers see the same thing) with each signal projected
therefore gives the sliced model's logits, without rotating or cutting a weight. The signals are
slicing's: the embedding output, each block's pre-MLP stream and each block output (one signal per
parallel-residual block); the last block output only when the head is sliced. LayerNorm families take
their bases from the centred signals, as slicing does after removing the mean; a kept span is then
orthogonal to the all-ones direction, so projecting the uncentred signal removes the mean too.

Where the bases come from decides how close the simulation is:
- `sequential`: each sparsity has its own calibration stream, projected at its own width as it goes,
  and each signal's basis is the PCA of that projected stream: SliceGPT's own bases, exactly when the
  stream holds every calibration window (what anchors use), estimated from fewer windows otherwise;
- `dense`: one unprojected calibration stream gives every sparsity's bases (one pass for all), which
  ignores that slicing's later bases see the earlier slicing's errors;
- the stock layout: one basis for every signal, the PCA of all of them pooled on the dense stream, as
  `workers.slicing.stock` takes it: the simulation is the stock-sliced model (every signal projected,
  the last block output too).
PCA as slicing's (`workers.slicing.pca`): float64 moments, 1 % damping, eigenvectors by eigenvalue.
The calibration streams (not the tracks, not an anchor's) may run a copy of each block in a cheaper
dtype, their moments still summed and multiplied in float64 (`workers.simulation.streams_dtype` says
when). Their products stay float64 even for bfloat16 signals: float32 products (a few 1e-7 of an
entry) moved SmolLM2's every-window curve by 1-1.5 % at s = 0.4 and 0.5 through the sequential
streams, for about 8 s of a curve (bench/README.md, `moment_products.py`).

Cost: the calibration streams' block passes and moments (one D x D eigendecomposition per stream and
signal) and, per simulated sparsity, the evaluation windows' block passes plus two (W T x D x d)
products per signal; memory: one block on the device, every stream's hidden states where the model
lives (calibration: N T D per sequential stream, a share of it with `basis_windows`; evaluation:
W T D per sparsity).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from workers.architectures import FamilyAdapter
from workers.block_inputs import BlockBatch, map_tensors, move_to
from workers.pruning.stream import walk_blocks
from workers.simulation.basis_regression import (
    CrossMoment,
    DenseReference,
    measure_reference,
    regressed_moment,
)
from workers.simulation.tracks import ProgressCallback, StopCheck, Track
from workers.slicing.pca import SecondMoment, principal_basis
from workers.slicing.portable.sliced_modules import ParallelSkipConnectedBlock, SkipConnectedBlock
from workers.slicing.stock import DEFAULT_POOLING, pooled_moment

Advance = Callable[[BlockBatch], torch.Tensor]
"""One batch's signal after the next half-block (B, T, D), on the compute device."""


@dataclass
class BasisStream:
    """Calibration windows whose signals give bases: projected at `width` as they go (sequential), or
    left dense (`width` None: one stream serving every sparsity). A sequential stream over a subset
    with a `reference` takes each basis from its moment regressed onto every window
    (`workers.simulation.basis_regression`)."""

    batches: list[BlockBatch]
    width: int | None
    basis: torch.Tensor | None = None  # (D, D) float64: the current signal's eigenvectors
    reference: DenseReference | None = None
    model_dtype: bool = False  # an anchor's: in the model's dtype whatever `Projection.streams_dtype` says


@dataclass
class ProjectedTrack(Track):
    """One simulated sparsity: its evaluation windows and where its bases come from."""

    width: int = 0
    source: BasisStream | None = None  # None: the shared stock basis
    kept_bases: list[torch.Tensor | None] | None = None  # set: each signal's basis is kept here (tasks)


@dataclass(frozen=True)
class Projection:
    """What every signal step needs."""

    adapter: FamilyAdapter
    full: int
    centred: bool  # LayerNorm family: bases from the centred signals
    slice_head: bool  # the last block output is projected too
    compute: torch.device
    home: torch.device
    shared: torch.Tensor | None = None  # the stock layout's one basis (D, D)
    streams_dtype: torch.dtype | None = None  # the calibration streams' dtype (None: the model's)


@dataclass
class Streams:
    """Every calibration stream of a simulation: the dense references first (the corrected streams
    read their current signal), then the basis streams; `seconds` they took, their moments and
    eigendecompositions included."""

    references: list[DenseReference]
    bases: list[BasisStream]
    seconds: float = 0.0

    @property
    def any_cheap(self) -> bool:
        """Whether a stream runs in `Projection.streams_dtype` (an anchor's never does)."""
        return bool(self.references) or any(not stream.model_dtype for stream in self.bases)


def project(hidden: torch.Tensor, basis: torch.Tensor, width: int) -> torch.Tensor:
    """hidden Q_d Q_dᵀ: the signal's part in the top-`width` directions, in the signal's dtype. Where
    fewer directions are dropped than kept it subtracts the dropped part instead, h - h Q_r Q_rᵀ (the
    same projection in 2 D (D - d) rather than 2 D d multiply-adds per position)."""
    full = basis.shape[1]
    if width >= full:
        return hidden
    if 2 * width <= full:
        kept = basis[:, :width].to(device=hidden.device, dtype=hidden.dtype)  # (D, d)
        return (hidden @ kept) @ kept.T
    dropped = basis[:, width:].to(device=hidden.device, dtype=hidden.dtype)  # (D, D - d)
    return hidden - (hidden @ dropped) @ dropped.T


def simulate_projected(
    model: nn.Module,
    projection: Projection,
    streams: list[BasisStream],
    tracks: list[ProjectedTrack],
    progress: ProgressCallback | None,
    should_stop: StopCheck | None,
) -> float:
    """Run every stream and track through the blocks (one block on the device at a time), each signal
    projected as the module docstring says; the tracks' batches end at the last block's output.
    Returns the seconds the calibration streams took (the rest went to the tracks)."""
    adapter = projection.adapter
    blocks = adapter.blocks(model)
    references = {id(s.reference): s.reference for s in streams if s.reference is not None}
    calibration = Streams(list(references.values()), streams)
    _cast_streams(calibration, projection.streams_dtype)
    entry = _Steps(lambda batch: batch.hidden.to(projection.compute))
    _signal(projection, calibration, tracks, entry, last=False)
    for index, block in walk_blocks(
        blocks, compute=projection.compute, home=projection.home, progress=progress, should_stop=should_stop
    ):
        low = _in_dtype(block, projection.streams_dtype) if calibration.any_cheap else block
        track_steps = _halves(block, adapter, index, projection.compute)
        stream_steps = track_steps if low is block else _halves(low, adapter, index, projection.compute)
        for half, (track_step, stream_step) in enumerate(zip(track_steps, stream_steps, strict=True)):
            last = index == len(blocks) - 1 and half == len(track_steps) - 1
            _signal(projection, calibration, tracks, _Steps(track_step, stream_step), last)
    for reference in calibration.references:
        reference.batches.clear()
    for stream in streams:
        stream.batches.clear()
    return calibration.seconds


def stock_basis(
    model: nn.Module,
    projection: Projection,
    calibration: list[BlockBatch],
    progress: ProgressCallback | None,
    should_stop: StopCheck | None,
) -> torch.Tensor:
    """The stock layout's one basis: slicing's own pooled dense pass (`workers.slicing.stock`)."""
    blocks = projection.adapter.blocks(model)
    moment = pooled_moment(
        projection.adapter,
        blocks,
        calibration,
        projection.full,
        projection.compute,
        projection.home,
        DEFAULT_POOLING,
        {"blocks": []},
        progress,
        should_stop,
    )
    calibration.clear()
    return principal_basis(moment.matrix)[1]


def _attention_half(wrapper: SkipConnectedBlock, index: int, compute: torch.device) -> Advance:
    def advance(batch: BlockBatch) -> torch.Tensor:
        hidden, (args, kwargs) = move_to((batch.hidden, batch.call(index)), compute)
        return wrapper.attention_residual(hidden, wrapper.call_arguments(hidden, args, kwargs))

    return advance


def _mlp_half(wrapper: SkipConnectedBlock, compute: torch.device) -> Advance:
    def advance(batch: BlockBatch) -> torch.Tensor:
        return wrapper.mlp_residual(batch.hidden.to(compute))

    return advance


def _whole(block: ParallelSkipConnectedBlock, index: int, compute: torch.device) -> Advance:
    def advance(batch: BlockBatch) -> torch.Tensor:
        hidden, (args, kwargs) = move_to((batch.hidden, batch.call(index)), compute)
        return block(hidden, *args, **kwargs)

    return advance


def _halves(block: nn.Module, adapter: FamilyAdapter, index: int, compute: torch.device) -> list[Advance]:
    """The block's steps from signal to signal: the whole block where it is parallel, else its
    attention half and its MLP half (identity skips: the dense block, branch by branch)."""
    if adapter.is_parallel(block):
        return [_whole(ParallelSkipConnectedBlock(block, adapter), index, compute)]
    wrapper = SkipConnectedBlock(block, adapter)
    return [_attention_half(wrapper, index, compute), _mlp_half(wrapper, compute)]


@dataclass(frozen=True)
class _Steps:
    """One step for the tracks (and the anchors' streams) and the same step for the other calibration
    streams, which may run a copy of the block in `Projection.streams_dtype`."""

    tracks: Advance
    streams: Advance | None = None

    def of(self, stream: BasisStream | None) -> Advance:
        """The step a stream takes (None: a dense reference)."""
        if self.streams is None or (stream is not None and stream.model_dtype):
            return self.tracks
        return self.streams


def _in_dtype(block: nn.Module, dtype: torch.dtype | None) -> nn.Module:
    """The block itself, or where `dtype` differs from its weights' a copy of it in `dtype` (on the
    compute device, as the block is while it is walked)."""
    weight = next(block.parameters(), None)
    if dtype is None or weight is None or weight.dtype == dtype:
        return block
    return copy.deepcopy(block).to(dtype)


def _cast_streams(streams: Streams, dtype: torch.dtype | None) -> None:
    """Every calibration stream's hidden states and floating call tensors (masks, rotary tables) in
    `dtype`, once before the walk; the batches' calls are shared, so each is cast once."""
    if dtype is None:
        return
    calls: dict[int, list[Any]] = {}
    cheap = [stream.batches for stream in streams.bases if not stream.model_dtype]
    for batches in [reference.batches for reference in streams.references] + cheap:
        for position, batch in enumerate(batches):
            if id(batch.calls) not in calls:
                calls[id(batch.calls)] = [_cast(call, dtype) for call in batch.calls]
            cast = calls[id(batch.calls)]
            batches[position] = replace(batch, hidden=batch.hidden.to(dtype), calls=cast)


def _cast(value: Any, dtype: torch.dtype) -> Any:
    """`value` with every floating tensor inside (nested tuples, lists, dicts) in `dtype`."""
    return map_tensors(value, lambda tensor: tensor.to(dtype) if tensor.is_floating_point() else tensor)


def _signal(
    projection: Projection,
    streams: Streams,
    tracks: list[ProjectedTrack],
    steps: _Steps,
    last: bool,
) -> None:
    """Advance every stream and track to the next signal; take each stream's basis of it; project the
    sequential streams and the tracks on theirs (the last block output: only with a sliced head)."""
    projected = projection.slice_head or not last
    started = time.perf_counter()
    for reference in streams.references:
        _advance_reference(projection, reference, steps.of(None), measure=projected)
    for stream in streams.bases:
        _advance_stream(projection, stream, steps.of(stream), measure=projected)
    streams.seconds += time.perf_counter() - started
    kept: dict[int, torch.Tensor] = {}  # one copy per basis: dense and stock bases serve every track
    for track in tracks:
        basis = projection.shared if track.source is None else track.source.basis
        if track.kept_bases is not None:
            if projected and id(basis) not in kept:
                kept[id(basis)] = _kept(basis, projection.home)
            track.kept_bases.append(kept[id(basis)] if projected else None)
        for batch in track.batches:
            signal = steps.tracks(batch)  # (B, T, D)
            if projected:
                assert basis is not None
                signal = project(signal, basis, track.width)
            batch.hidden = signal.to(projection.home)


def _advance_stream(projection: Projection, stream: BasisStream, advance: Advance, measure: bool) -> None:
    """One calibration stream to its next signal; with `measure`, that signal's basis, and the stream
    projected on it if sequential."""
    moment = SecondMoment(projection.full, projection.compute) if measure else None
    reference = stream.reference if measure else None
    cross = CrossMoment(projection.full, projection.compute) if reference is not None else None
    for index, batch in enumerate(stream.batches):
        signal = advance(batch)  # (B, T, D)
        if moment is not None:
            measured = _centre(signal) if projection.centred else signal
            moment.add(measured, batch.keep)
            if cross is not None and reference is not None:
                dense = reference.batches[index].hidden.to(projection.compute)
                cross.add(measured, _centre(dense) if projection.centred else dense, batch.keep)
        batch.hidden = signal.to(projection.home)
    if moment is None:
        return
    if cross is not None and reference is not None:
        stream.basis = principal_basis(regressed_moment(moment.matrix, moment.positions, cross, reference))[1]
    else:
        stream.basis = principal_basis(moment.matrix)[1]
    if stream.width is not None:
        for batch in stream.batches:
            kept = project(batch.hidden.to(projection.compute), stream.basis, stream.width)
            batch.hidden = kept.to(projection.home)


def _advance_reference(
    projection: Projection, reference: DenseReference, advance: Advance, measure: bool
) -> None:
    """The dense reference stream to its next signal; with `measure`, that signal's moments."""
    signals = []
    for batch in reference.batches:
        signal = advance(batch)  # (B, T, D)
        batch.hidden = signal.to(projection.home)
        if measure:
            signals.append(_centre(signal) if projection.centred else signal)
    if measure:
        measure_reference(reference, signals, projection.full, projection.compute)


def _kept(basis: torch.Tensor | None, home: torch.device) -> torch.Tensor:
    """A signal's basis as a whole-model simulation keeps it: float32 where the model lives (the
    projection itself runs in the signal's dtype either way)."""
    assert basis is not None
    return basis.to(device=home, dtype=torch.float32)


def _centre(x: torch.Tensor) -> torch.Tensor:
    return x - x.mean(dim=-1, keepdim=True)
