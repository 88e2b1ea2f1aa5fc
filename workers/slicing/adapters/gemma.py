"""Gemma-2/3 blocks: Llama's linears with a norm on each branch's output before the residual add.

    h = x + post_attention_layernorm(o_proj(attn(q_proj, k_proj, v_proj of input_layernorm(x))))
    y = h + post_feedforward_layernorm(down_proj(act(gate_proj(n)) * up_proj(n))),
        n = pre_feedforward_layernorm(h)

Every norm scales by (1 + weight). The pruners and probes use this adapter to find blocks, linears
and the branches' true outputs; SliceGPT cannot use it, because a norm on the branch output is not
invariant under a rotation of the residual stream (`problems` says so, naming the model).
"""

from __future__ import annotations

from torch import nn
from transformers import PreTrainedModel

from core.families import post_norm_refusal
from workers.slicing.adapters.base import config_dict
from workers.slicing.adapters.llama import LlamaAdapter
from workers.slicing.portable.sliced_modules import get_path


class GemmaAdapter(LlamaAdapter):
    """Llama's paths, but the MLP reads `pre_feedforward_layernorm` and each branch ends at a norm."""

    name = "gemma"
    mlp_norm_path = "pre_feedforward_layernorm"
    attn_output_norm_path = "post_attention_layernorm"
    mlp_output_norm_path = "post_feedforward_layernorm"
    block_children = LlamaAdapter.block_children | {"pre_feedforward_layernorm", "post_feedforward_layernorm"}

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        """Llama's structure plus both output norms in every block."""
        if not super().matches(model):
            return False
        norms = (cls.attn_output_norm_path, cls.mlp_output_norm_path)
        return all(
            isinstance(get_path(block, path), nn.Module)
            for block in get_path(model, cls.blocks_path)
            for path in norms
            if path is not None
        )

    def problems(self, model: PreTrainedModel) -> str | None:
        return post_norm_refusal(config_dict(model))
