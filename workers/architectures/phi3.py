"""Phi-3 blocks: Llama-style with fused projections and residual dropouts.

    h = x + dropout(o_proj(attn(qkv_proj(input_layernorm(x)))))
    y = h + dropout(down_proj(up * act(gate))),  [gate, up] = gate_up_proj(post_attention_layernorm(h))

The fused qkv_proj and gate_up_proj each read the whole norm output, so each is one reader.
"""

from __future__ import annotations

from workers.architectures.base import FamilyAdapter


class Phi3Adapter(FamilyAdapter):
    name = "phi3"
    uses_layernorm = False

    decoder_path = "model"
    blocks_path = "model.layers"
    embedding_paths = ("model.embed_tokens",)
    final_norm_path = "model.norm"

    attn_norm_path = "input_layernorm"
    attn_reader_paths = ("self_attn.qkv_proj",)
    attn_writer_paths = ("self_attn.o_proj",)
    mlp_norm_path = "post_attention_layernorm"
    mlp_reader_paths = ("mlp.gate_up_proj",)
    mlp_writer_paths = ("mlp.down_proj",)
    block_children = frozenset(
        {
            "self_attn",
            "mlp",
            "input_layernorm",
            "post_attention_layernorm",
            "resid_attn_dropout",
            "resid_mlp_dropout",
        }
    )
    attention_dropout_path = "resid_attn_dropout"
    mlp_dropout_path = "resid_mlp_dropout"
