"""Gemma-2/3 blocks: Llama's linears with a norm on each branch's output before the residual add.

    h = x + post_attention_layernorm(o_proj(attn(q_proj, k_proj, v_proj of input_layernorm(x))))
    y = h + post_feedforward_layernorm(down_proj(act(gate_proj(n)) * up_proj(n))),
        n = pre_feedforward_layernorm(h)

Every norm scales by (1 + weight). A rotation of the residual stream cannot pass through a norm on a
branch's output (it rescales coordinate by coordinate), so slicing leaves the writers and that norm
at the full width D and rotates after it: the norm becomes a `ProjectedRMSNorm` whose D x d matrix
holds its scale and the next signal's kept directions (docs/science.md, "Slicing through
branch-output norms"). The pruners and probes use this adapter to find blocks, linears and the
branches' true outputs.
"""

from __future__ import annotations

from torch import nn

from workers.architectures.llama import LlamaAdapter
from workers.slicing.portable.sliced_modules import get_path, unwrap


class GemmaAdapter(LlamaAdapter):
    """Llama's paths, but the MLP reads `pre_feedforward_layernorm` and each branch ends at a norm."""

    name = "gemma"
    norm_scale_offset = 1.0
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
            isinstance(get_path(unwrap(block), path), nn.Module)
            for block in get_path(model, cls.blocks_path)
            for path in norms
            if path is not None
        )
