"""The intra-layer methods simulated: the dense model with a method's masks applied to each block's
weights for the length of one forward, then the weights put back.

A masked block is the pruned block, so what decides the simulation's accuracy is only which
statistics pick the masks (docs/science.md §2, "Simulated curves"):
- magnitude and magnitude-row read no data: the simulation is the pruned model itself;
- Wanda's face value takes its input norms from the dense calibration stream, one pass for every
  sparsity, where Wanda itself takes them from the stream as it leaves the already pruned blocks;
- SparseGPT's face value is Wanda's mask without SparseGPT's weight update: a proxy, not a bound
  (on SmolLM2 it lies below SparseGPT at s = 0.2-0.3, above it at 0.1 and from 0.4; bench/README.md);
- an anchor runs the method itself: its own calibration stream through its own pruned blocks, the
  statistics recorded from it (`workers.pruning.sequential`), SparseGPT's update included.
The rule applied to each linear is the pruning engine's (`workers.pruning.rules`).

Cost per block: one recorded pass of the dense calibration stream (data methods), two passes of each
anchor's stream, and per simulated sparsity the masks (one sort per linear) and one pass of the
evaluation windows. Memory: one block's weights twice (the originals, to put back), every stream's
hidden states where the model lives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from workers.architectures import FamilyAdapter
from workers.block_inputs import BlockBatch
from workers.pruning.linears import block_linears, weight_out_in
from workers.pruning.masks import UNSTRUCTURED
from workers.pruning.recording import InputRecorder, InputStatistic
from workers.pruning.rules import LinearRule
from workers.pruning.sequential import input_statistics
from workers.pruning.stream import run_block, walk_blocks
from workers.simulation.tracks import ProgressCallback, StopCheck, Track
from workers.simulation.whole_models import restore_weights


@dataclass
class MaskedTrack(Track):
    """One simulated sparsity; an anchor of a data method carries its own calibration stream."""

    calibration: list[BlockBatch] | None = None


@dataclass(frozen=True)
class Masking:
    """The rules: `face` picks the simulated tracks' masks, `own` (the method's) the anchors'."""

    adapter: FamilyAdapter
    face: LinearRule
    own: LinearRule
    compute: torch.device
    home: torch.device


@torch.no_grad()
def simulate_masked(
    model: nn.Module,
    masking: Masking,
    dense_calibration: list[BlockBatch],
    tracks: list[MaskedTrack],
    progress: ProgressCallback | None,
    should_stop: StopCheck | None,
    kept_statistics: list[dict[str, InputStatistic] | None] | None = None,
) -> None:
    """Run every track through the blocks with its masks (module docstring); `dense_calibration` (empty
    for data-free rules) feeds the face rule's statistics and ends at the last block's output. With
    `kept_statistics`, each block's face statistics are appended to it (None for data-free rules)."""
    blocks = masking.adapter.blocks(model)
    for index, block in walk_blocks(
        blocks, compute=masking.compute, home=masking.home, progress=progress, should_stop=should_stop
    ):
        linears = block_linears(masking.adapter, block)
        originals = [weight_out_in(module).detach().clone() for _, module in linears]
        dense = (
            _recorded_pass(masking, linears, dense_calibration, index, block) if dense_calibration else None
        )
        if kept_statistics is not None:
            kept_statistics.append(dense)
        for track in tracks:
            if not track.batches and track.calibration is None:
                continue  # no window here: its pilot runs on a copy later (`workers.kinds.simulate_windows`)
            rule, statistics = masking.face, dense
            if track.calibration is not None:  # the method itself on its own pruned stream
                rule = masking.own
                assert rule.statistic is not None  # only data rules give an anchor its own stream
                statistics = input_statistics(
                    linears, track.calibration, index, block, rule.statistic, masking.compute
                )
            for path, module in linears:
                rule.prune(
                    module, None if statistics is None else statistics[path], track.sparsity, UNSTRUCTURED
                )
            for batch in track.batches + (track.calibration or []):
                batch.hidden = run_block(block, index, batch, masking.compute).to(masking.home)
            restore_weights(linears, originals)
    dense_calibration.clear()
    for track in tracks:
        if track.calibration is not None:
            track.calibration.clear()


def _recorded_pass(
    masking: Masking,
    linears: list[tuple[str, nn.Module]],
    batches: list[BlockBatch],
    index: int,
    block: nn.Module,
) -> dict[str, InputStatistic]:
    """The face rule's statistics of the dense stream through the dense block; the stream advances."""
    assert masking.face.statistic is not None
    with InputRecorder(linears, masking.face.statistic, masking.compute) as recorder:
        for batch in batches:
            recorder.start(batch.keep)
            batch.hidden = run_block(block, index, batch, masking.compute).to(masking.home)
    return recorder.statistics(index)
