"""Parameter counts of a dense model and of its SliceGPT-sliced version, from the config alone.

Torch-free so the API can quote "real parameter fraction removed" before a job runs. The engine
checks these predictions against the parameters it actually produced (`SlicingReport`), and the
tests check them for every family.

Sliced layout (D = hidden size, d = kept width, L = blocks, V = vocabulary):
- embeddings (and learned positions) keep d columns;
- every linear reading the residual keeps d input columns; every linear writing it keeps d output
  rows (and bias entries); head and MLP inner widths are unchanged;
- norms lose their parameters (folded into the readers; replaced by a weight-free RMSNorm);
  LayerNorm biases become biases of the readers, which gain one if they had none (the LM head
  too, for the final LayerNorm);
- a branch that ends at a norm (Gemma-2/3) keeps its writers at D rows, and that norm's D scale
  becomes a D x d projection (the rotation follows the norm; `sliced_modules.ProjectedRMSNorm`);
- each sequential block gains two skip matrices, d x d each, so about 2 * L * d^2 in all;
  a parallel-residual block (Phi-2, Pythia) gains one;
- the LM head is untied from the embeddings (V x D more parameters for tied models) and keeps its
  D input columns unless the head is sliced too; then the last block's MLP writes D rows and its
  MLP skip matrix is d x D. GPT-2 always slices its head (see `families.head_sliced_by_default`).

Stock layout (one basis for every signal, RMSNorm families): the sliced model is the dense
architecture with hidden_size d (`stock_config`), head untied, so its count is the dense formula
applied to that config.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from core.families import family_from_config, head_sliced_by_default


def sliced_width(hidden_size: int, sparsity: float, round_to: int = 8) -> int:
    """d = floor((1 - s) * D), rounded down to a multiple of `round_to`."""
    if not 0.0 <= sparsity < 1.0:
        raise ValueError(f"sparsity must be in [0, 1), got {sparsity}")
    if round_to < 1:
        raise ValueError(f"round_to must be a positive integer, got {round_to}")
    # round() first so that e.g. (1 - 0.3) * 10 = 6.999999 still counts as 7
    kept = math.floor(round((1.0 - sparsity) * hidden_size, 9))
    kept -= kept % round_to
    if kept <= 0:
        raise ValueError(
            f"sparsity {sparsity} leaves no dimension of hidden size {hidden_size} "
            f"once rounded down to a multiple of {round_to}"
        )
    return kept


@dataclass(frozen=True)
class _Shape:
    """The sizes a parameter count needs, normalised across families."""

    vocab: int
    hidden: int
    layers: int
    positions: int  # rows of a learned position table; 0 for rotary models
    attn_in_out: int  # total output width of the linears reading the attention norm (q + k + v)
    attn_in_bias: bool
    attn_inner: int  # input width of the attention output linear
    attn_out_bias: bool
    extra_attn: int  # per-block parameters untouched by slicing (e.g. Qwen3 q/k norms)
    mlp_in_out: int  # total output width of the linears reading the MLP norm (gate + up, or fc1)
    mlp_in_bias: bool
    mlp_inner: int  # input width of the MLP output linear
    mlp_out_bias: bool
    norm_params: int  # parameters of one norm (D or 2D)
    tied: bool
    norms_per_block: int = 2  # 1 where both branches read one norm (Phi-2)
    parallel: bool = False  # parallel residual: one skip per block, attention writes the block output
    head_bias: bool = False
    output_norms: bool = False  # a norm on each branch's output (Gemma-2/3): writers keep D rows


def _llama_shape(config: Mapping[str, Any]) -> _Shape:
    model_type = config.get("model_type")
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    attention_bias = bool(config.get("attention_bias", False))
    qkv_bias = {"qwen2": True, "mistral": False, "phi3": False}.get(str(model_type), attention_bias)
    o_bias = {"qwen2": False, "mistral": False, "phi3": False}.get(str(model_type), attention_bias)
    mlp_bias = bool(config.get("mlp_bias", False)) if model_type == "llama" else False
    inner = int(config["intermediate_size"])
    return _Shape(
        vocab=int(config["vocab_size"]),
        hidden=hidden,
        layers=int(config["num_hidden_layers"]),
        positions=0,
        attn_in_out=(heads + 2 * kv_heads) * head_dim,
        attn_in_bias=qkv_bias,
        attn_inner=heads * head_dim,
        attn_out_bias=o_bias,
        extra_attn=2 * head_dim if model_type == "qwen3" else 0,
        mlp_in_out=2 * inner,
        mlp_in_bias=mlp_bias,
        mlp_inner=inner,
        mlp_out_bias=mlp_bias,
        norm_params=hidden,
        tied=bool(config.get("tie_word_embeddings", False)),
    )


def _gemma_shape(config: Mapping[str, Any]) -> _Shape:
    """Llama's linears (no MLP bias), four norms per block, per-head q/k norms in Gemma-3."""
    llama = _llama_shape({**config, "model_type": "llama", "mlp_bias": False})
    head_dim = int(config.get("head_dim") or llama.hidden // int(config["num_attention_heads"]))
    gemma3 = config.get("model_type") == "gemma3_text"
    return replace(llama, extra_attn=2 * head_dim if gemma3 else 0, norms_per_block=4, output_norms=True)


def _opt_shape(config: Mapping[str, Any]) -> _Shape:
    hidden = int(config["hidden_size"])
    bias = bool(config.get("enable_bias", True))
    affine = bool(config.get("layer_norm_elementwise_affine", True))
    ffn = int(config["ffn_dim"])
    return _Shape(
        vocab=int(config["vocab_size"]),
        hidden=hidden,
        layers=int(config["num_hidden_layers"]),
        positions=int(config["max_position_embeddings"]) + 2,  # OPT's position offset of 2
        attn_in_out=3 * hidden,
        attn_in_bias=bias,
        attn_inner=hidden,
        attn_out_bias=bias,
        extra_attn=0,
        mlp_in_out=ffn,
        mlp_in_bias=bias,
        mlp_inner=ffn,
        mlp_out_bias=bias,
        norm_params=2 * hidden if affine else 0,
        tied=bool(config.get("tie_word_embeddings", True)),
    )


def _gpt2_shape(config: Mapping[str, Any]) -> _Shape:
    hidden = int(config["n_embd"])
    inner = int(config.get("n_inner") or 4 * hidden)
    return _Shape(
        vocab=int(config["vocab_size"]),
        hidden=hidden,
        layers=int(config["n_layer"]),
        positions=int(config["n_positions"]),
        attn_in_out=3 * hidden,
        attn_in_bias=True,
        attn_inner=hidden,
        attn_out_bias=True,
        extra_attn=0,
        mlp_in_out=inner,
        mlp_in_bias=True,
        mlp_inner=inner,
        mlp_out_bias=True,
        norm_params=2 * hidden,
        tied=bool(config.get("tie_word_embeddings", True)),
    )


def _phi_shape(config: Mapping[str, Any]) -> _Shape:
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = hidden // heads
    inner = int(config["intermediate_size"])
    return _Shape(
        vocab=int(config["vocab_size"]),
        hidden=hidden,
        layers=int(config["num_hidden_layers"]),
        positions=0,
        attn_in_out=(heads + 2 * kv_heads) * head_dim,
        attn_in_bias=True,
        attn_inner=heads * head_dim,
        attn_out_bias=True,
        extra_attn=4 * head_dim if config.get("qk_layernorm", False) else 0,
        mlp_in_out=inner,
        mlp_in_bias=True,
        mlp_inner=inner,
        mlp_out_bias=True,
        norm_params=2 * hidden,
        tied=bool(config.get("tie_word_embeddings", False)),
        norms_per_block=1,
        parallel=True,
        head_bias=True,
    )


def _gpt_neox_shape(config: Mapping[str, Any]) -> _Shape:
    hidden = int(config["hidden_size"])
    bias = bool(config.get("attention_bias", True))
    inner = int(config["intermediate_size"])
    return _Shape(
        vocab=int(config["vocab_size"]),
        hidden=hidden,
        layers=int(config["num_hidden_layers"]),
        positions=0,
        attn_in_out=3 * hidden,
        attn_in_bias=bias,
        attn_inner=hidden,
        attn_out_bias=bias,
        extra_attn=0,
        mlp_in_out=inner,
        mlp_in_bias=True,
        mlp_inner=inner,
        mlp_out_bias=True,
        norm_params=2 * hidden,
        tied=bool(config.get("tie_word_embeddings", False)),
        parallel=bool(config.get("use_parallel_residual", True)),
    )


_SHAPES: dict[str, Callable[[Mapping[str, Any]], _Shape]] = {
    "llama": _llama_shape,
    "phi3": _llama_shape,
    "opt": _opt_shape,
    "gpt2": _gpt2_shape,
    "phi": _phi_shape,
    "gpt_neox": _gpt_neox_shape,
    "gemma": _gemma_shape,
}
"""Family (core.families) -> the sizes its parameter formula needs, from the config."""


def _shape(config: Mapping[str, Any]) -> _Shape:
    family = family_from_config(config)
    shape = _SHAPES.get(family or "")
    if shape is None:
        raise ValueError(
            f"no parameter formula for model_type {config.get('model_type')!r} (family {family!r})"
        )
    return shape(config)


def predict_dense_param_count(config: Mapping[str, Any]) -> int:
    """Parameters of the unmodified model (a tied head counted once)."""
    s = _shape(config)
    width = s.hidden
    per_block = (
        width * s.attn_in_out
        + s.attn_in_bias * s.attn_in_out
        + s.attn_inner * width
        + s.attn_out_bias * width
        + s.extra_attn
        + width * s.mlp_in_out
        + s.mlp_in_bias * s.mlp_in_out
        + s.mlp_inner * width
        + s.mlp_out_bias * width
        + s.norms_per_block * s.norm_params
    )
    head = (0 if s.tied else s.vocab * width) + s.head_bias * s.vocab
    return (s.vocab + s.positions) * width + s.layers * per_block + s.norm_params + head


def stock_config(config: Mapping[str, Any], width: int) -> dict[str, Any]:
    """The HF config of the stock-layout model sliced to `width`: hidden_size d, head_dim stated
    (the attention keeps its heads, so it no longer equals hidden_size / heads), head untied (the
    final norm's scale is folded into the head, which the embedding cannot share), every RMSNorm's
    epsilon scaled by D / d (a norm over d coordinates then divides by the RMS over the original
    D; docs/science.md, stock layout)."""
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    sliced = dict(config)
    sliced["head_dim"] = int(config.get("head_dim") or hidden // heads)
    sliced["hidden_size"] = width
    sliced["tie_word_embeddings"] = False
    sliced["rms_norm_eps"] = float(config["rms_norm_eps"]) * hidden / width
    return sliced


def predict_stock_param_count(config: Mapping[str, Any], width: int) -> int:
    """Parameters of the stock-layout model sliced to `width` (d)."""
    return predict_dense_param_count(stock_config(config, width))


def predict_sliced_param_count(
    config: Mapping[str, Any], width: int, *, slice_head: bool | None = None
) -> int:
    """Parameters after slicing the residual stream to `width` (d) with the layout above.

    `slice_head` None means the family's default (`families.head_sliced_by_default`).
    """
    s = _shape(config)
    if slice_head is None:
        slice_head = head_sliced_by_default(str(family_from_config(config)))
    if not 0 < width <= s.hidden:
        raise ValueError(f"sliced width must be in (0, {s.hidden}], got {width}")
    # A LayerNorm with a bias gives every reader a bias once it is folded in.
    reader_gets_bias = s.norm_params == 2 * s.hidden
    attn_in_bias = s.attn_in_bias or reader_gets_bias
    mlp_in_bias = s.mlp_in_bias or reader_gets_bias

    def block(out_width: int) -> int:
        # a parallel block's attention writes the block output and it has one skip matrix;
        # a sequential block's attention writes the stream between its branches (width d)
        attn_out_width = out_width if s.parallel else width
        skips = width * out_width if s.parallel else width * width + width * out_width
        # with output norms the writers keep D rows and each norm becomes a D x width projection
        attn_rows = s.hidden if s.output_norms else attn_out_width
        mlp_rows = s.hidden if s.output_norms else out_width
        projections = s.output_norms * s.hidden * (attn_out_width + out_width)
        return (
            width * s.attn_in_out
            + attn_in_bias * s.attn_in_out
            + s.attn_inner * attn_rows
            + s.attn_out_bias * attn_rows
            + s.extra_attn
            + width * s.mlp_in_out
            + mlp_in_bias * s.mlp_in_out
            + s.mlp_inner * mlp_rows
            + s.mlp_out_bias * mlp_rows
            + skips
            + projections
        )

    last_width = width if slice_head else s.hidden
    blocks = (s.layers - 1) * block(width) + block(last_width)
    head_bias = reader_gets_bias or s.head_bias  # the final LayerNorm's bias lands in the head
    head = s.vocab * last_width + head_bias * s.vocab
    return (s.vocab + s.positions) * width + blocks + head
