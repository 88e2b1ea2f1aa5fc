"""Phi-1.5 / Phi-2 blocks: parallel residual with ONE LayerNorm read by both branches:

    n = input_layernorm(x)
    y = x + dropout(dense(attn(q_proj, k_proj, v_proj of n))) + dropout(fc2(gelu(fc1(n))))

LayerNorm with bias (mean removal first), rotary positions, untied head with a bias. The shared
norm is folded into all of q/k/v and fc1. Optional per-head q/k LayerNorms act after the
projections and never see the residual stream.
"""

from __future__ import annotations

from workers.architectures.base import FamilyAdapter


class PhiAdapter(FamilyAdapter):
    name = "phi"
    uses_layernorm = True

    decoder_path = "model"
    blocks_path = "model.layers"
    embedding_paths = ("model.embed_tokens",)
    final_norm_path = "model.final_layernorm"

    attn_norm_path = "input_layernorm"
    attn_reader_paths = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
    attn_writer_paths = ("self_attn.dense",)
    mlp_norm_path = "input_layernorm"  # the same module: both branches read one norm
    mlp_reader_paths = ("mlp.fc1",)
    mlp_writer_paths = ("mlp.fc2",)
    block_children = frozenset({"self_attn", "mlp", "input_layernorm", "resid_dropout"})
    attention_dropout_path = "resid_dropout"
    mlp_dropout_path = "resid_dropout"
    parallel_default = True
