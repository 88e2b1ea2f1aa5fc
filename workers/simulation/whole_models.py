"""A simulated sparsity as a whole model, for the scorers that run the model's own forward (tasks).

The simulation engines run evaluation windows block by block as streams of equal-length windows;
multiple-choice and LAMBADA batches are padded sequences of other lengths, scored by the task
scorers through the model's own forward (KV caches included for generation). So each simulated
sparsity keeps what made it, and `applied(model)` turns the dense model into that simulated model
for the length of a `with`:
- `ProjectedModel` (SliceGPT): every decoder block swapped for a wrapper that runs the dense block
  branch by branch (`SkipConnectedBlock`, identity skips) and projects each residual signal on the
  basis the stream used at that signal, the embedding signal as the first block's input; the same
  arithmetic as `workers.simulation.projection`, so on the evaluation windows it gives the stream's
  logits. Memory: one D x D float32 basis per signal (SmolLM2-135M: 61 signals, 81 MB).
- `MaskedModel` (magnitude, Wanda, SparseGPT's Wanda-mask proxy): every block's linears masked in
  place by the face rule with the statistics the stream recorded (Wanda's input norms, a vector per
  linear), then put back. Memory: one copy of every block's linear weights, where the model lives.

An offloaded model keeps streaming: the swap and the masking happen with its hooks suspended, and the
hooks resume on what is in place (`workers.offload.suspended`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from workers.architectures import FamilyAdapter
from workers.offload import suspended
from workers.pruning.linears import block_linears, weight_out_in
from workers.pruning.masks import UNSTRUCTURED
from workers.pruning.recording import InputStatistic
from workers.pruning.rules import LinearRule
from workers.simulation.projection import project
from workers.slicing.portable.sliced_modules import ParallelSkipConnectedBlock, SkipConnectedBlock

SignalBases = list[torch.Tensor | None]
"""Per residual signal in the stream's order (the embedding output, then each block's pre-MLP stream
and output; one output per parallel block), the (D, D) basis it was projected on, or None where it was
not (the last block output of an unsliced head)."""


@dataclass
class ProjectedModel:
    """SliceGPT at one sparsity, simulated: each signal projected on its basis' top `width` directions."""

    sparsity: float
    adapter: FamilyAdapter
    width: int
    bases: SignalBases

    @contextmanager
    def applied(self, model: nn.Module) -> Iterator[None]:
        blocks = self.adapter.blocks(model)
        originals = list(blocks)
        wrappers = self._wrappers(originals)
        with suspended(model):
            for index, wrapper in enumerate(wrappers):
                blocks[index] = wrapper
        try:
            yield
        finally:
            with suspended(model):
                for index, block in enumerate(originals):
                    blocks[index] = block

    def _wrappers(self, originals: list[nn.Module]) -> list[nn.Module]:
        """Each block wrapped with the bases of its signals; ValueError unless they match one for one."""
        parallel = [self.adapter.is_parallel(block) for block in originals]
        expected = 1 + sum(1 if flag else 2 for flag in parallel)
        if len(self.bases) != expected:
            raise ValueError(
                f"{len(self.bases)} signal bases for {len(originals)} blocks, which have {expected}"
            )
        signals = iter(self.bases)
        entry = next(signals)
        wrappers: list[nn.Module] = []
        bases: tuple[torch.Tensor | None, ...]
        for block, is_parallel in zip(originals, parallel, strict=True):
            if is_parallel:
                bases = (entry, next(signals))
                wrappers.append(_projecting(_ProjectedParallelBlock(block, self.adapter), self.width, bases))
            else:
                bases = (entry, next(signals), next(signals))
                wrappers.append(_projecting(_ProjectedBlock(block, self.adapter), self.width, bases))
            entry = None  # only the first block's input is a signal of its own
        return wrappers


@dataclass
class MaskedModel:
    """An intra-layer method at one sparsity, simulated: every linear masked by `rule`, which reads
    the statistics the stream recorded for its block (None per block for rules that read no data)."""

    sparsity: float
    adapter: FamilyAdapter
    rule: LinearRule
    statistics: Sequence[dict[str, InputStatistic] | None]
    compute: torch.device

    @contextmanager
    def applied(self, model: nn.Module) -> Iterator[None]:
        blocks = self.adapter.blocks(model)
        if len(self.statistics) != len(blocks):
            raise ValueError(f"statistics of {len(self.statistics)} blocks for a model of {len(blocks)}")
        originals: list[list[torch.Tensor]] = []
        with suspended(model), torch.no_grad():
            for block, statistics in zip(blocks, self.statistics, strict=True):
                home = next(block.parameters()).device
                linears = block_linears(self.adapter, block.to(self.compute))
                originals.append(
                    [weight_out_in(module).detach().to(home, copy=True) for _, module in linears]
                )
                for path, module in linears:
                    statistic = None if statistics is None else statistics[path]
                    self.rule.prune(module, statistic, self.sparsity, UNSTRUCTURED)
                block.to(home)
        try:
            yield
        finally:
            with suspended(model), torch.no_grad():
                for block, saved in zip(blocks, originals, strict=True):
                    restore_weights(block_linears(self.adapter, block), saved)


SimulatedModel = ProjectedModel | MaskedModel


def restore_weights(linears: list[tuple[str, nn.Module]], originals: list[torch.Tensor]) -> None:
    """Put back the weights a mask changed (`originals` in the linears' order)."""
    for (_, module), original in zip(linears, originals, strict=True):
        weight_out_in(module).copy_(original)


class _ProjectedBlock(SkipConnectedBlock):
    """A sequential block whose input (first block only), pre-MLP stream and output are projected;
    `width` and `signal_bases` (entry, middle, out) are set by `_projecting`."""

    width: int
    signal_bases: tuple[torch.Tensor | None, ...]  # plain attributes: `project` moves them per call

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        call = self.call_arguments(hidden_states, args, kwargs)
        entry, middle, out = self.signal_bases
        hidden = _projected(hidden_states, entry, self.width)
        hidden = _projected(self.attention_residual(hidden, call), middle, self.width)
        return _projected(self.mlp_residual(hidden), out, self.width)


class _ProjectedParallelBlock(ParallelSkipConnectedBlock):
    """A parallel-residual block whose input (first block only) and output are projected;
    `signal_bases` is (entry, out)."""

    width: int
    signal_bases: tuple[torch.Tensor | None, ...]

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        call = self.call_arguments(hidden_states, args, kwargs)
        entry, out = self.signal_bases
        hidden = _projected(hidden_states, entry, self.width)
        return _projected(hidden + self.branches_output(hidden, call), out, self.width)


def _projecting(
    wrapper: _ProjectedBlock | _ProjectedParallelBlock, width: int, bases: tuple[torch.Tensor | None, ...]
) -> nn.Module:
    """`wrapper` projecting on `bases` (its signals' in order) at `width`."""
    wrapper.width = width
    wrapper.signal_bases = bases
    return wrapper


def _projected(hidden: torch.Tensor, basis: torch.Tensor | None, width: int) -> torch.Tensor:
    """The projection in float32 at least: a bfloat16 Q_d Q_dᵀ is no projector, and its rounding of
    the whole kept part (s >= 0.5) moved SmolLM2's ln PPL by 0.013 (bench/window_dtype.py)."""
    if basis is None:
        return hidden
    if hidden.dtype in (torch.float32, torch.float64):
        return project(hidden, basis, width)
    return project(hidden.float(), basis, width).to(hidden.dtype)
