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
working copy, damped Hessian and inverse factor. These are live tensors: a process's peak RSS
adds what the allocator keeps of freed buffers (glibc's defaults kept up to 130 MiB more on
SmolLM2, varying run to run; with MALLOC_MMAP_THRESHOLD_=1048576 the peak stayed under the formula,
at about a third more wall time). bench/memory_pruners.py checks it (bench/README.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from workers.architectures import FamilyAdapter
from workers.block_inputs import BlockBatch
from workers.pruning.linears import block_linears
from workers.pruning.recording import InputRecorder, InputStatistic, NewStatistic
from workers.pruning.stream import ProgressCallback, StopCheck, run_block, walk_blocks

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
        statistics = input_statistics(linears, batches, index, block, new_statistic, compute)
        for path, module in linears:
            prune_linear(module, statistics[path])
        del statistics
        for batch in batches:
            batch.hidden = run_block(block, index, batch, compute).to(home)  # (B, T, D): next block's input


def input_statistics(
    linears: list[tuple[str, nn.Module]],
    batches: list[BlockBatch],
    index: int,
    block: nn.Module,
    new_statistic: NewStatistic,
    compute: torch.device,
) -> dict[str, InputStatistic]:
    """Each linear's input statistic over every batch's unpadded tokens, from one run of the block
    (shared by the linears that read one tensor: `workers.pruning.recording`)."""
    with InputRecorder(linears, new_statistic, compute) as recorder:
        for batch in batches:
            recorder.start(batch.keep)
            run_block(block, index, batch, compute)
    return recorder.statistics(index)
