"""Steps 1-3 of SliceGPT: untie the head, remove the mean (LayerNorm models), fold every norm.

After `fuse_model` the model computes the same function, but every norm is a weight-free
`RMSNormNoScale`, so the residual stream can be rotated by any orthogonal Q (readers W @ Q,
writers Q.T @ W, embeddings E @ Q, head W @ Q) without changing the logits: computational
invariance, the property slicing builds on. The engine fuses block by block while the block is on
the compute device; `fuse_model` does everything at once for checks and tests.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel

from workers.architectures import FamilyAdapter
from workers.slicing.portable.modeling_prunecast_sliced import replace_block_norms
from workers.slicing.portable.sliced_modules import RMSNormNoScale, norm_epsilon
from workers.slicing.weights import centre_embedding, centre_writer, fold_norm_into_readers


def hidden_width(model: PreTrainedModel, adapter: FamilyAdapter) -> int:
    """D: the width of the residual stream of the dense model."""
    return int(adapter.embeddings(model)[0].weight.shape[1])


def untie_head(model: PreTrainedModel, adapter: FamilyAdapter) -> None:
    """Give the LM head its own copy of the weight it shares with the token embedding, if any."""
    head = adapter.lm_head(model)
    embedding = adapter.embeddings(model)[0]
    if head.weight is embedding.weight or head.weight.data_ptr() == embedding.weight.data_ptr():
        head.weight = nn.Parameter(
            embedding.weight.detach().clone(), requires_grad=embedding.weight.requires_grad
        )
    model.config.tie_word_embeddings = False
    if hasattr(model, "all_tied_weights_keys"):
        model.all_tied_weights_keys = {}  # so a later tie_weights() cannot re-tie them


def fuse_embeddings(model: PreTrainedModel, adapter: FamilyAdapter, device: torch.device) -> None:
    """For LayerNorm models, centre every embedding row (positions included), untying the head first
    (it reads the uncentred table). An RMSNorm model's head stays tied until `fuse_final_norm`
    gives it its own weight: slicing then never holds that copy beside its calibration stream."""
    if adapter.uses_layernorm:
        untie_head(model, adapter)
        for embedding in adapter.embeddings(model):
            centre_embedding(embedding, device)


def fuse_block(block: nn.Module, adapter: FamilyAdapter, full_width: int, device: torch.device) -> None:
    """Centre the block's residual writers (LayerNorm models) and fold both norms into their readers."""
    if adapter.uses_layernorm:
        for writer in adapter.attn_writers(block) + adapter.mlp_writers(block):
            centre_writer(writer, device)
    attn_norm, mlp_norm = adapter.attn_norm(block), adapter.mlp_norm(block)
    if isinstance(attn_norm, RMSNormNoScale) or isinstance(mlp_norm, RMSNormNoScale):
        raise ValueError("block is already fused")
    if attn_norm is mlp_norm:  # one norm read by both branches (Phi-2)
        folds = [(attn_norm, adapter.attn_readers(block) + adapter.mlp_readers(block))]
    else:
        folds = [(attn_norm, adapter.attn_readers(block)), (mlp_norm, adapter.mlp_readers(block))]
    for norm, readers in folds:
        scale, shift = adapter.norm_scale_shift(norm)
        fold_norm_into_readers(readers, scale, shift, device)
    replace_block_norms(block, adapter, full_width)


def fuse_final_norm(
    model: PreTrainedModel,
    adapter: FamilyAdapter,
    full_width: int,
    device: torch.device,
    rotation: torch.Tensor | None = None,
) -> None:
    """Fold the final norm into the LM head, which leaves it untied, and replace the norm by a
    weight-free RMSNorm. The embedding table must still be the dense one (a tied head reads it).
    `rotation` (D, keep), float64 on `device`: the head's input rotation, applied in the same
    pass over its rows (slicing's last step), so the head is copied once, not twice."""
    norm = adapter.final_norm(model)
    if isinstance(norm, RMSNormNoScale):
        raise ValueError("final norm is already fused")
    scale, shift = adapter.norm_scale_shift(norm)
    fold_norm_into_readers([adapter.lm_head(model)], scale, shift, device, rotation)  # a new head weight
    untie_head(model, adapter)  # a copy only if no fold replaced the shared weight
    adapter.set_final_norm(model, RMSNormNoScale(full_width, norm_epsilon(norm)))


@torch.no_grad()
def fuse_model(model: PreTrainedModel, adapter: FamilyAdapter, device: torch.device | str = "cpu") -> None:
    """All of steps 1-3, in place, on the whole model. The logits do not change."""
    device = torch.device(device)
    width = hidden_width(model, adapter)
    fuse_embeddings(model, adapter, device)
    for block in adapter.blocks(model):
        fuse_block(block, adapter, width, device)
    fuse_final_norm(model, adapter, width, device)
