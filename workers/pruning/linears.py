"""The linears an intra-layer pruner works on: every reader and writer of each decoder block.

Embeddings, norms and the LM head are left dense, as in the Wanda and SparseGPT references.
GPT-2's Conv1D stores its weight as (in, out); `weight_out_in` gives a (out, in) view of either
kind, so masks and solvers always see rows = outputs and columns = inputs.
"""

from __future__ import annotations

import torch
from torch import nn

from workers.architectures import FamilyAdapter
from workers.slicing.portable.sliced_weights import weight_out_in

__all__ = ["block_linears", "prunable_counts", "weight_out_in"]


def block_linears(adapter: FamilyAdapter, block: nn.Module) -> list[tuple[str, nn.Module]]:
    """(path in the block, module) for each linear reading or writing the block's residual stream."""
    paths = (
        adapter.attn_reader_paths
        + adapter.attn_writer_paths
        + adapter.mlp_reader_paths
        + adapter.mlp_writer_paths
    )
    modules = adapter.attn_readers(block) + adapter.attn_writers(block)
    modules += adapter.mlp_readers(block) + adapter.mlp_writers(block)
    linears: list[tuple[str, nn.Module]] = []
    for path, module in zip(paths, modules, strict=True):
        if all(module is not seen for _, seen in linears):
            linears.append((path, module))
    return linears


def linear_weights(adapter: FamilyAdapter, model: nn.Module) -> list[torch.Tensor]:
    """Every block linear's (out, in) weight view, in block order."""
    blocks = adapter.blocks(model)
    return [weight_out_in(module) for block in blocks for _, module in block_linears(adapter, block)]


def prunable_counts(adapter: FamilyAdapter, model: nn.Module) -> tuple[int, int]:
    """(weights, zero weights) over every block linear of the model."""
    weights = linear_weights(adapter, model)
    return sum(weight.numel() for weight in weights), sum(int((weight == 0).sum()) for weight in weights)
