"""GPT-2 blocks.

    h = x + attn.c_proj(attn(attn.c_attn(ln_1(x))))
    y = h + mlp.c_proj(gelu(mlp.c_fc(ln_2(h))))

LayerNorm with bias (mean removal first), learned positions (wpe), LM head tied to wte. The
linears are Conv1D, storing weights as [in, out]; `workers.slicing.weights` handles the transpose.
c_attn is a fused q/k/v reader; its output split size is the head width, which slicing keeps.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from workers.architectures.base import FamilyAdapter


class GPT2Adapter(FamilyAdapter):
    name = "gpt2"
    uses_layernorm = True

    decoder_path = "transformer"
    blocks_path = "transformer.h"
    embedding_paths = ("transformer.wte", "transformer.wpe")
    final_norm_path = "transformer.ln_f"

    attn_norm_path = "ln_1"
    attn_reader_paths = ("attn.c_attn",)
    attn_writer_paths = ("attn.c_proj",)
    mlp_norm_path = "ln_2"
    mlp_reader_paths = ("mlp.c_fc",)
    mlp_writer_paths = ("mlp.c_proj",)
    block_children = frozenset({"ln_1", "attn", "ln_2", "mlp"})
    attention_path = "attn"
    attention_by_name = False
    attention_ignored = ("encoder_hidden_states", "encoder_attention_mask")

    def attention_branch(self, block: nn.Module, normed: torch.Tensor, call: dict[str, Any]) -> torch.Tensor:
        if call.get("encoder_hidden_states") is not None:
            raise ValueError("sliced GPT-2 blocks do not support cross-attention inputs")
        return super().attention_branch(block, normed, call)
