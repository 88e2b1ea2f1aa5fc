"""Attention drop and MLP drop: remove whole attention (or MLP) branches from the least useful layers.

Importance of a branch (one dense pass over the calibration tokens, padded positions excluded):
the mean over tokens of cos(x, x + branch(x)), with x the residual stream entering that branch.
Sequential blocks: x is the block input for attention and x + attn(x) for the MLP. Parallel-residual
blocks (phi, gpt_neox by default) add both branches to the block input, so x is the block input for
both. The n branches with the highest cosine change the stream least and are dropped.

Dropping zeroes the branch's writer linears (weight and bias). The branch then adds exactly zero to
the stream, which is the same math as removing it, and the model stays a stock transformers model
that `save_pretrained` / `from_pretrained` handle. The parameters of the dropped branch (its
readers, writers, any other weights of its module, and its norm unless the other branch shares it)
count as removed: a serving stack can delete them, though the saved checkpoint keeps them.

The branch outputs are read where the adapter says the branch ends (`branch_outputs`): the writers'
outputs, or the output norm of families that normalise a branch before the add (Gemma's
post-norms, which map a zero writer output to exactly zero, so zeroing the writers still removes
the branch). That is what the block adds to the stream in eval mode (dropout is the identity).
Each block's output is checked against that sum, so a family whose blocks do more (scaled
residuals, an unaccounted norm) is refused rather than mis-scored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from workers.architectures import FamilyAdapter, UnsupportedArchitectureError
from workers.block_inputs import BlockBatch
from workers.pruning.stream import ProgressCallback, StopCheck, run_block, token_cosines, walk_blocks
from workers.slicing.portable.sliced_modules import BRANCHES, submodule
from workers.slicing.portable.sliced_weights import bias_of, tensor_of


@dataclass(frozen=True)
class BranchScores:
    """Mean cos(x, x + branch(x)) per dense layer for each branch."""

    attention: list[float]
    mlp: list[float]


@torch.no_grad()
def branch_cosines(
    adapter: FamilyAdapter,
    blocks: nn.ModuleList,
    batches: list[BlockBatch],
    *,
    compute: torch.device,
    progress: ProgressCallback | None = None,
    should_stop: StopCheck | None = None,
) -> BranchScores:
    """Score both branches of every block on the dense model; `batches` end at the last block's output."""
    scores = BranchScores(attention=[], mlp=[])
    home = batches[0].hidden.device
    for index, block in walk_blocks(
        blocks, compute=compute, home=home, progress=progress, should_stop=should_stop
    ):
        attention, mlp = _score_block(adapter, index, block, batches, compute)
        scores.attention.append(attention)
        scores.mlp.append(mlp)
    return scores


def _score_block(
    adapter: FamilyAdapter, index: int, block: nn.Module, batches: list[BlockBatch], compute: torch.device
) -> tuple[float, float]:
    """(attention, MLP) mean cosines of one dense block; advances every batch to the block's output."""
    parallel = adapter.is_parallel(block)
    outputs: dict[str, torch.Tensor] = {}  # branch -> what it added to the stream, for the batch being run

    def hook_for(branch: str) -> Callable[[nn.Module, tuple[Any, ...], torch.Tensor], None]:
        def record(_module: nn.Module, _args: tuple[Any, ...], output: torch.Tensor) -> None:
            outputs[branch] = output if branch not in outputs else outputs[branch] + output

        return record

    handles = [
        writer.register_forward_hook(hook_for(branch))
        for branch in BRANCHES
        for writer in adapter.branch_outputs(block, branch)
    ]
    sums = {branch: 0.0 for branch in BRANCHES}
    tokens = 0
    try:
        for batch in batches:
            outputs.clear()
            x = batch.hidden.to(compute)  # (B, T, D)
            y = run_block(block, index, batch, compute)  # (B, T, D)
            attn = outputs["attention"].reshape(x.shape)  # (B, T, D)
            mlp = outputs["mlp"].reshape(x.shape)  # (B, T, D)
            _check_residual_sum(adapter, index, x, attn, mlp, y)
            mlp_input = x if parallel else x + attn  # (B, T, D)
            sums["attention"] += float(token_cosines(x, x + attn, batch.keep).sum())
            sums["mlp"] += float(token_cosines(mlp_input, mlp_input + mlp, batch.keep).sum())
            tokens += int(batch.keep.sum())
            batch.hidden = y.to(batch.hidden.device)  # next block's input
    finally:
        for handle in handles:
            handle.remove()
    return sums["attention"] / tokens, sums["mlp"] / tokens


def _check_residual_sum(
    adapter: FamilyAdapter,
    index: int,
    x: torch.Tensor,
    attn: torch.Tensor,
    mlp: torch.Tensor,
    y: torch.Tensor,
) -> None:
    """The block must compute y = x + attn + mlp, else zeroing a writer would not remove a branch."""
    expected = (x + attn + mlp).double()  # (B, T, D)
    error = float((y.double() - expected).norm() / y.double().norm().clamp_min(1e-30))
    tolerance = 1e-4 if y.dtype in (torch.float32, torch.float64) else 2e-2
    if not error <= tolerance:
        raise UnsupportedArchitectureError(
            f"block {index} of this {adapter.name} model does not compute input + attention + MLP "
            f"(relative error {error:.2g}; e.g. post-norm OPT-350m or scaled residuals), so a branch "
            "cannot be dropped by zeroing its writers; use method 'shortgpt' or an intra-layer method"
        )


def choose_dropped(scores: list[float], count: int) -> list[int]:
    """The `count` layers with the highest cosine (ties: the earlier layer first), ascending."""
    order = sorted(range(len(scores)), key=lambda layer: (-scores[layer], layer))
    return sorted(order[:count])


@torch.no_grad()
def zero_branch(adapter: FamilyAdapter, block: nn.Module, branch: str) -> None:
    """Make the branch add exactly zero to the stream: zero its writers' weights and biases."""
    for writer in adapter.writers(block, branch):
        tensor_of(writer, "weight").zero_()
        bias = bias_of(writer)
        if bias is not None:
            bias.zero_()


def branch_parameters(adapter: FamilyAdapter, block: nn.Module, branch: str) -> list[nn.Parameter]:
    """The parameters a dropped branch no longer needs, each once.

    The module owning each reader and writer (`self_attn` for `self_attn.q_proj`; the linear itself
    when it sits directly in the block, as OPT's fc1), plus the branch's norm unless both branches
    share one norm (phi).
    """
    if branch == "attention":
        paths = adapter.attn_reader_paths + adapter.attn_writer_paths
        norm, other_norm = adapter.attn_norm(block), adapter.mlp_norm(block)
    else:
        paths = adapter.mlp_reader_paths + adapter.mlp_writer_paths
        norm, other_norm = adapter.mlp_norm(block), adapter.attn_norm(block)
    owners = [submodule(block, path.split(".")[0]) for path in paths]
    owners += [output for output in adapter.branch_outputs(block, branch) if output not in owners]
    if norm is not other_norm:
        owners.append(norm)
    unique: dict[int, nn.Parameter] = {}
    for owner in owners:
        for parameter in owner.parameters():
            unique[id(parameter)] = parameter
    return list(unique.values())
