"""OPT blocks (pre-LayerNorm variants: 125m, 1.3b and up; not 350m).

    h = x + dropout(out_proj(attn(q_proj, k_proj, v_proj of self_attn_layer_norm(x))))
    y = h + dropout(fc2(relu(fc1(final_layer_norm(h)))))

LayerNorm with bias, so the engine removes the mean from the stream first. The learned position
table has two extra leading rows (HF's offset of 2); they are centred, rotated and sliced like the
others. Configs with word_embed_proj_dim != hidden_size (project_in/project_out) are refused.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from workers.architectures.base import FamilyAdapter


class OPTAdapter(FamilyAdapter):
    name = "opt"
    uses_layernorm = True

    decoder_path = "model.decoder"
    blocks_path = "model.decoder.layers"
    embedding_paths = ("model.decoder.embed_tokens", "model.decoder.embed_positions")
    final_norm_path = "model.decoder.final_layer_norm"

    attn_norm_path = "self_attn_layer_norm"
    attn_reader_paths = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
    attn_writer_paths = ("self_attn.out_proj",)
    mlp_norm_path = "final_layer_norm"
    mlp_reader_paths = ("fc1",)
    mlp_writer_paths = ("fc2",)
    block_children = frozenset(
        {"self_attn", "self_attn_layer_norm", "fc1", "fc2", "final_layer_norm", "activation_fn"}
    )
    attention_ignored = ("use_cache",)  # OPT's decoder layer takes it, its attention does not
    mlp_chain = ("fc1", "activation_fn", "fc2")

    # OPT applies its residual dropout functionally (p = block.dropout), not as a module.
    def attention_branch(self, block: nn.Module, normed: torch.Tensor, call: dict[str, Any]) -> torch.Tensor:
        return _dropout(block, super().attention_branch(block, normed, call))

    def mlp_branch(self, block: nn.Module, normed: torch.Tensor) -> torch.Tensor:
        return _dropout(block, super().mlp_branch(block, normed))


def _dropout(block: nn.Module, output: torch.Tensor) -> torch.Tensor:
    return nn.functional.dropout(output, p=float(getattr(block, "dropout", 0.0)), training=block.training)
