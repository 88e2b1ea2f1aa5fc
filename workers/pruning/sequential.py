"""Block-by-block calibration for the pruners that need input statistics (Wanda, SparseGPT).

As in both references: for each block, forward hooks on each of its linears accumulate that
linear's input statistic over every calibration batch (the block's inputs already carry the
pruning of every earlier block); then every linear of the block is pruned; then the block runs
again with its pruned weights to give the next block's inputs. Only one block's statistics and
one set of activations exist at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import nn

from workers.block_inputs import BlockBatch
from workers.pruning.linears import block_linears, weight_out_in
from workers.pruning.stream import ProgressCallback, StopCheck, run_block, token_rows, walk_blocks
from workers.slicing.adapters import FamilyAdapter


class InputStatistic(Protocol):
    """Something that accumulates a linear's inputs, token rows (n, in) at a time."""

    def add(self, rows: torch.Tensor) -> None: ...


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
    for _, block in walk_blocks(
        blocks, compute=compute, home=home, progress=progress, should_stop=should_stop
    ):
        linears = block_linears(adapter, block)
        statistics = _input_statistics(linears, batches, block, new_statistic, compute)
        for path, module in linears:
            prune_linear(module, statistics[path])
        del statistics
        for batch in batches:
            batch.hidden = run_block(block, batch, compute).to(home)  # (B, T, D): next block's input


def _input_statistics(
    linears: list[tuple[str, nn.Module]],
    batches: list[BlockBatch],
    block: nn.Module,
    new_statistic: NewStatistic,
    compute: torch.device,
) -> dict[str, InputStatistic]:
    """Each linear's input statistic over every batch's unpadded tokens, from one run of the block."""
    statistics = {path: new_statistic(weight_out_in(module).shape[1], compute) for path, module in linears}
    current: dict[str, torch.Tensor] = {}  # the keep mask of the batch being run

    def hook_for(path: str) -> Callable[[nn.Module, tuple[Any, ...]], None]:
        def record(_module: nn.Module, args: tuple[Any, ...]) -> None:
            statistics[path].add(token_rows(args[0], current["keep"]))  # (n, in)

        return record

    handles = [module.register_forward_pre_hook(hook_for(path)) for path, module in linears]
    try:
        for batch in batches:
            current["keep"] = batch.keep
            run_block(block, batch, compute)
    finally:
        for handle in handles:
            handle.remove()
    return statistics
