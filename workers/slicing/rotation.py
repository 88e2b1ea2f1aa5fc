"""Step 4 of SliceGPT: rotate a fused model by one orthogonal Q, deleting nothing.

The logits must not change (computational invariance). This is the engine's first check for
every family; slicing is the same surgery with a different Q per signal and columns dropped.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from transformers import PreTrainedModel

from workers.architectures import FamilyAdapter
from workers.slicing.portable.sliced_modules import RMSNormNoScale
from workers.slicing.portable.sliced_weights import bias_of
from workers.slicing.weights import project_output_norm, rotate_embedding, rotate_readers, rotate_writers


@torch.no_grad()
def rotate_fused_model(model: PreTrainedModel, adapter: FamilyAdapter, basis: torch.Tensor) -> None:
    """Rotate the whole residual stream of a fused model by `basis` (D x D orthogonal)."""
    if not isinstance(adapter.final_norm(model), RMSNormNoScale):
        raise ValueError("rotate a fused model (see workers.slicing.fusion.fuse_model)")
    basis = basis.to(torch.float64)
    width = basis.shape[0]
    for embedding in adapter.embeddings(model):
        rotate_embedding(embedding, basis, width)
    for block in adapter.blocks(model):
        rotate_readers(adapter.attn_readers(block) + adapter.mlp_readers(block), basis, width)
        rotate_branch_output(adapter, block, "attention", basis, width)
        rotate_branch_output(adapter, block, "mlp", basis, width)
    rotate_readers([adapter.lm_head(model)], basis, width)


def rotate_branch_output(
    adapter: FamilyAdapter, block: nn.Module, branch: str, basis: torch.Tensor, keep: int
) -> None:
    """Make `branch` ("attention" or "mlp") write into basis Q, keeping `keep` directions: its
    writers become Q^T W, or, where the branch ends at a norm (Gemma), the writers stay at width D
    and the norm becomes a `ProjectedRMSNorm` onto Q[:, :keep] (a rotation cannot pass through a
    norm that rescales each coordinate, but it can follow it)."""
    norm = adapter.output_norm(block, branch)
    if norm is None:
        rotate_writers(adapter.writers(block, branch), basis, keep)
        return
    scale, _ = adapter.norm_scale_shift(norm)
    adapter.set_output_norm(block, branch, project_output_norm(norm, scale, basis, keep))


@contextmanager
def writers_in_frame(
    adapter: FamilyAdapter, block: nn.Module, branches: tuple[str, ...], basis: torch.Tensor
) -> Iterator[bool]:
    """While inside, the writers of `branches` write in the frame of `basis` (Q^T W at full width,
    nothing dropped): a block whose input stream holds the first d coordinates of that frame then
    adds its residual by padding, with no skip product (`block_slicing._slice_sequential_block`,
    "Frames"). On exit the original writers are back, so their final rotation is computed from
    them and adds no rounding.

    Yields False and changes nothing where a branch ends at a norm (Gemma's): rotating after the
    norm would cost a D x D product per position, more than the d x D skip it saves."""
    if any(adapter.output_norm(block, branch) is not None for branch in branches):
        yield False
        return
    writers = [writer for branch in branches for writer in adapter.writers(block, branch)]
    originals = [(writer, writer.weight, bias_of(writer)) for writer in writers]
    rotate_writers(writers, basis, basis.shape[1])
    try:
        yield True
    finally:
        for writer, weight, bias in originals:
            writer.weight = weight
            if bias is not None:
                writer.bias = bias


def random_orthogonal(width: int, seed: int = 0) -> torch.Tensor:
    """A Haar-random orthogonal matrix (float64), reproducible from the seed."""
    generator = torch.Generator().manual_seed(seed)
    gaussian = torch.randn(width, width, generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(gaussian)
    return q * torch.sign(torch.diagonal(r))[None, :]
