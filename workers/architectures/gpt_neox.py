"""GPT-NeoX blocks (Pythia), parallel residual by default:

    y = x + dropout(dense(attn(query_key_value(input_layernorm(x)))))
          + dropout(dense_4h_to_h(gelu(dense_h_to_4h(post_attention_layernorm(x)))))

With use_parallel_residual false the same modules form a sequential block (the MLP norm reads
x + attention). LayerNorm with bias (mean removal first), rotary positions, untied head.
"""

from __future__ import annotations

from workers.architectures.base import FamilyAdapter


class GPTNeoXAdapter(FamilyAdapter):
    name = "gpt_neox"
    uses_layernorm = True

    decoder_path = "gpt_neox"
    blocks_path = "gpt_neox.layers"
    embedding_paths = ("gpt_neox.embed_in",)
    final_norm_path = "gpt_neox.final_layer_norm"
    head_path = "lm_head"

    attn_norm_path = "input_layernorm"
    attn_reader_paths = ("attention.query_key_value",)
    attn_writer_paths = ("attention.dense",)
    mlp_norm_path = "post_attention_layernorm"
    mlp_reader_paths = ("mlp.dense_h_to_4h",)
    mlp_writer_paths = ("mlp.dense_4h_to_h",)
    block_children = frozenset(
        {
            "input_layernorm",
            "post_attention_layernorm",
            "post_attention_dropout",
            "post_mlp_dropout",
            "attention",
            "mlp",
        }
    )
    attention_path = "attention"
    attention_by_name = False
    attention_dropout_path = "post_attention_dropout"
    mlp_dropout_path = "post_mlp_dropout"
    parallel_attribute = "use_parallel_residual"
    parallel_default = True
