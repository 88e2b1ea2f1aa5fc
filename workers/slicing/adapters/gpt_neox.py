"""GPT-NeoX blocks (Pythia), parallel residual by default:

    y = x + dropout(dense(attn(query_key_value(input_layernorm(x)))))
          + dropout(dense_4h_to_h(gelu(dense_h_to_4h(post_attention_layernorm(x)))))

With use_parallel_residual false the same modules form a sequential block (the MLP norm reads
x + attention). LayerNorm with bias (mean removal first), rotary positions, untied head.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from workers.slicing.adapters.base import FamilyAdapter, submodule, unwrap


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

    def is_parallel(self, block: nn.Module) -> bool:
        return bool(getattr(unwrap(block), "use_parallel_residual", True))

    def attention_branch(self, block: nn.Module, normed: torch.Tensor, call: dict[str, Any]) -> torch.Tensor:
        output, _ = submodule(block, "attention")(normed, **call)
        return submodule(block, "post_attention_dropout")(output)

    def mlp_branch(self, block: nn.Module, normed: torch.Tensor) -> torch.Tensor:
        return submodule(block, "post_mlp_dropout")(submodule(block, "mlp")(normed))
