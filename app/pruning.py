"""Submit-time facts about the pruning methods, from a model's config dict alone (no torch).

The HTTP side refuses here what a worker would refuse after loading the model; the engine applies
the same rules (`layers_dropped` is the one definition of how many layers a drop method removes).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CAUSAL_LM_SUFFIXES = ("ForCausalLM", "LMHeadModel")
LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers")


def result_method(method: str, pattern: str = "unstructured") -> str:
    """The method name results are stored under: an N:M pattern is part of it ("wanda-2:4"), so that
    curves, predictions and exports never mix patterns of one method."""
    return method if pattern == "unstructured" else f"{method}-{pattern}"


def layers_dropped(sparsity: float, num_layers: int) -> int:
    """n = round(sparsity * L): how many attention branches, MLP branches or blocks a drop removes."""
    return round(sparsity * num_layers)


def num_layers(config: Mapping[str, Any]) -> int | None:
    """The number of blocks L, when the config says it."""
    for key in LAYER_COUNT_KEYS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def causal_lm_refusal(config: Mapping[str, Any]) -> str | None:
    """Why a model with this config is not a decoder-only causal LM (what the intra-layer and drop
    methods prune), or None when it is, or when the config does not say."""
    architectures = [a for a in config.get("architectures") or [] if isinstance(a, str)]
    described = f"{architectures[0] if architectures else 'model'} (model_type {config.get('model_type')!r})"
    if config.get("is_encoder_decoder"):
        return f"{described} is an encoder-decoder model; only decoder-only causal LMs can be pruned"
    if architectures and not any(a.endswith(CAUSAL_LM_SUFFIXES) for a in architectures):
        return (
            f"{described} is not a causal language model (its architectures are "
            f"{', '.join(architectures)}; expected a *ForCausalLM or *LMHeadModel class)"
        )
    return None


def drop_refusal(method: str, sparsity: float, config: Mapping[str, Any]) -> str | None:
    """Why dropping this fraction of the model's layers cannot work, or None."""
    layers = num_layers(config)
    if layers is None:
        return None
    dropped = layers_dropped(sparsity, layers)
    if dropped >= layers:
        what = {"attention-drop": "attention branch", "mlp-drop": "MLP branch"}.get(method, "block")
        return (
            f"{method} at sparsity {sparsity:g} removes round({sparsity:g} * {layers}) = {dropped} of the "
            f"model's {layers} layers, i.e. every {what}; use a sparsity below {(layers - 0.5) / layers:.3g}"
        )
    return None
