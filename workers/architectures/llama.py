"""Llama-style blocks: Llama 2/3, Mistral, Qwen2 (q/k/v biases), Qwen3 (per-head q/k norms), SmolLM.

    h = x + o_proj(attn(q_proj, k_proj, v_proj of input_layernorm(x)))
    y = h + down_proj(act(gate_proj(n)) * up_proj(n)),  n = post_attention_layernorm(h)

RMSNorm everywhere. Qwen3's q_norm/k_norm normalise each head after the projection: they read
q_proj/k_proj outputs, not the residual stream, so rotations and slicing never touch them.
"""

from __future__ import annotations

from workers.architectures.base import FamilyAdapter


class LlamaAdapter(FamilyAdapter):
    name = "llama"
    uses_layernorm = False

    decoder_path = "model"
    blocks_path = "model.layers"
    embedding_paths = ("model.embed_tokens",)
    final_norm_path = "model.norm"

    attn_norm_path = "input_layernorm"
    attn_reader_paths = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
    attn_writer_paths = ("self_attn.o_proj",)
    mlp_norm_path = "post_attention_layernorm"
    mlp_reader_paths = ("mlp.gate_proj", "mlp.up_proj")
    mlp_writer_paths = ("mlp.down_proj",)
    block_children = frozenset({"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"})
