"""Block-by-block calibration for the pruners that need input statistics (Wanda, SparseGPT).

As in both references: for each block, forward hooks on each of its linears accumulate that
linear's input statistic over every calibration batch (the block's inputs already carry the
pruning of every earlier block); then every linear of the block is pruned; then the block runs
again with its pruned weights to give the next block's inputs. Only one block's statistics and
one set of activations exist at a time.

Peak memory beyond the model and the captured stream (N x T x D in the model's dtype, held on the
home device): one block's activations for one batch, its distinct input statistics (Wanda: one
(in,) vector per distinct input; SparseGPT: one (in, in) fp32 Hessian per distinct input, so
4 (3 D^2 + F^2) bytes for a Llama block with hidden D and MLP width F, where one Hessian per
linear would be 4 (6 D^2 + F^2): q/k/v share one, gate/up one, o_proj and down_proj have their
own), one row chunk (`stream.ROW_CHUNK_ELEMENTS`) and, while SparseGPT solves one linear, its fp32
working copy, damped Hessian and inverse factor. bench/memory_pruners.py checks it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import nn

from workers.block_inputs import BlockBatch
from workers.pruning.linears import block_linears
from workers.pruning.stream import ProgressCallback, StopCheck, run_block, token_rows, walk_blocks
from workers.slicing.adapters import FamilyAdapter


class InputStatistic(Protocol):
    """Something that accumulates a linear's inputs, token rows (n, in) at a time; `keep` (n,)
    marks the rows that are real tokens."""

    def add(self, rows: torch.Tensor, keep: torch.Tensor | None = None) -> None: ...


NewStatistic = Callable[[int, torch.device], InputStatistic]  # (input features, device) -> statistic
PruneLinear = Callable[[nn.Module, Any], torch.Tensor]  # (linear, its statistic) -> prune mask (out, in)


@torch.no_grad()
def prune_sequentially(
    adapter: FamilyAdapter,
    blocks: nn.ModuleList,
    batches: list[BlockBatch],
    new_statistic: NewStatistic,
    prune_linear: PruneLinear,
    *,
    compute: torch.device,
    progress: ProgressCallback | None = None,
    should_stop: StopCheck | None = None,
) -> None:
    """Prune every block's linears in place, block by block; `batches` end at the last block's output."""
    home = batches[0].hidden.device
    for index, block in walk_blocks(
        blocks, compute=compute, home=home, progress=progress, should_stop=should_stop
    ):
        linears = block_linears(adapter, block)
        statistics = _input_statistics(linears, batches, index, block, new_statistic, compute)
        for path, module in linears:
            prune_linear(module, statistics[path])
        del statistics
        for batch in batches:
            batch.hidden = run_block(block, index, batch, compute).to(home)  # (B, T, D): next block's input


def _input_statistics(
    linears: list[tuple[str, nn.Module]],
    batches: list[BlockBatch],
    index: int,
    block: nn.Module,
    new_statistic: NewStatistic,
    compute: torch.device,
) -> dict[str, InputStatistic]:
    """Each linear's input statistic over every batch's unpadded tokens, from one run of the block.

    Linears called on the same tensor (q/k/v on the attention norm's output, gate/up on the MLP
    norm's) share one statistic, computed once: one Hessian for q, k and v instead of three equal
    ones. Sharing is found by identity of the input tensor within each batch's run (each first
    input is held until the run ends, so its memory cannot be reused by a later, different input)
    and must be the same in every batch.
    """
    statistics: dict[str, InputStatistic] = {}
    reads_from: dict[str, str] = {}  # path -> the path whose statistic it shares (itself if first)
    current: dict[str, Any] = {}  # the running batch's keep mask and inputs seen so far

    def hook_for(path: str) -> Callable[[nn.Module, tuple[Any, ...]], None]:
        def record(_module: nn.Module, args: tuple[Any, ...]) -> None:
            inputs = args[0]
            owner, _ = current["seen"].setdefault(id(inputs), (path, inputs))
            if reads_from.setdefault(path, owner) != owner:
                raise RuntimeError(f"{path} shared its input with {owner} in one batch and not in another")
            if owner != path:
                return
            if path not in statistics:
                statistics[path] = new_statistic(inputs.shape[-1], compute)
            statistics[path].add(*token_rows(inputs, current["keep"]))  # rows (n, in), keep (n,)

        return record

    handles = [module.register_forward_pre_hook(hook_for(path)) for path, module in linears]
    try:
        for batch in batches:
            current.update(keep=batch.keep, seen={})
            run_block(block, index, batch, compute)
    finally:
        current.clear()
        for handle in handles:
            handle.remove()
    silent = [path for path, _ in linears if path not in reads_from]
    if silent:
        raise RuntimeError(f"block {index}: {', '.join(silent)} never ran on the calibration batches")
    return {path: statistics[reads_from[path]] for path, _ in linears}
