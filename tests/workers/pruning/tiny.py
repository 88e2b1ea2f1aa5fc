"""Tiny in-memory models for pruning tests: the slicing tests' configs (randomised norm scales and
biases) with a chosen depth, models whose layers mix attention types, and helpers to make one
layer's branch nearly an identity."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import transformers
from transformers import PretrainedConfig, PreTrainedModel

from tests.workers.slicing.tiny import _COMMON, _DECODER, CONFIGS, build_from_config, token_ids
from workers.architectures import match_structure
from workers.pruning.linears import block_linears, weight_out_in

__all__ = [
    "MIXED",
    "SLICING_REFUSES",
    "build",
    "calibration",
    "scale_writers",
    "token_ids",
    "weights_by_name",
]

SLIDING, FULL = "sliding_attention", "full_attention"
# Layers of two attention types; a 4-token window is short enough against 16-token rows that
# giving a layer the other type's mask changes its output.
MIXED: dict[str, Callable[[], PretrainedConfig]] = {
    "gemma3": lambda: transformers.Gemma3TextConfig(
        **{**_DECODER, "num_hidden_layers": 4},
        **_COMMON,
        head_dim=16,
        sliding_window=4,
        layer_types=[SLIDING, SLIDING, FULL, SLIDING],
    ),
    "qwen2_sliding": lambda: transformers.Qwen2Config(
        **{**_DECODER, "num_hidden_layers": 3},
        **_COMMON,
        use_sliding_window=True,
        sliding_window=4,
        layer_types=[FULL, SLIDING, SLIDING],
    ),
}
# A structure the pruners and the profile know (Llama's) with norms slicing cannot fold: Gemma-1's
# RMSNorm scales by (1 + weight), and the family has no adapter of its own.
SLICING_REFUSES: dict[str, Callable[[], PretrainedConfig]] = {
    "gemma1": lambda: transformers.GemmaConfig(**_DECODER, **_COMMON, head_dim=16),
}


def build(case: str = "llama", layers: int | None = None, seed: int = 0, **overrides: Any) -> PreTrainedModel:
    """A tiny fp32 model in eval mode (`layers` overrides the depth, `overrides` any config field)
    with random norm scales and biases."""
    config = {**CONFIGS, **MIXED, **SLICING_REFUSES}[case]()
    if layers is not None:
        config.num_hidden_layers = layers
        if isinstance(getattr(config, "layer_types", None), list):  # one entry per layer (qwen2...)
            config.layer_types = [config.layer_types[0]] * layers
    for key, value in overrides.items():
        setattr(config, key, value)
    return build_from_config(config, seed)


def calibration(rows: int = 4, length: int = 16, seed: int = 0) -> torch.Tensor:
    return token_ids(rows, length, seed)


@torch.no_grad()
def scale_writers(model: PreTrainedModel, layer: int, branch: str, factor: float = 1e-3) -> None:
    """Multiply what one branch ("attention", "mlp" or "both") adds to the stream by `factor`: its
    writers' weight and bias, or, in families that normalise the branch output (Gemma's
    y = normalise(x) * (1 + w)), that norm's gain."""
    adapter = match_structure(model)
    block = adapter.blocks(model)[layer]
    ends = []
    if branch in ("attention", "both"):
        ends += adapter.branch_outputs(block, "attention")
    if branch in ("mlp", "both"):
        ends += adapter.branch_outputs(block, "mlp")
    writers = adapter.attn_writers(block) + adapter.mlp_writers(block)
    for module in ends:
        if not any(module is writer for writer in writers):
            module.weight.copy_((1.0 + module.weight) * factor - 1.0)
            continue
        module.weight.mul_(factor)
        if getattr(module, "bias", None) is not None:
            module.bias.mul_(factor)


def weights_by_name(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """Every block linear's weight as (out, in), by 'layer.path'."""
    adapter = match_structure(model)
    return {
        f"{index}.{path}": weight_out_in(module).detach().clone()
        for index, block in enumerate(adapter.blocks(model))
        for path, module in block_linears(adapter, block)
    }
