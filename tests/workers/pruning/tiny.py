"""Tiny in-memory models for pruning tests: the slicing tests' configs (randomised norm scales and
biases) with a chosen depth, and helpers to make one layer's branch nearly an identity."""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedModel

from tests.workers.slicing.tiny import CONFIGS, build_from_config, token_ids
from workers.pruning.linears import block_linears, weight_out_in
from workers.slicing.adapters import match_structure

__all__ = ["build", "calibration", "scale_writers", "token_ids", "weights_by_name"]


def build(case: str = "llama", layers: int | None = None, seed: int = 0, **overrides: Any) -> PreTrainedModel:
    """A tiny fp32 model in eval mode (`layers` overrides the depth, `overrides` any config field)
    with random norm scales and biases."""
    config = CONFIGS[case]()
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
    """Multiply the writers (weight and bias) of one branch ("attention", "mlp" or "both") by factor."""
    adapter = match_structure(model)
    block = adapter.blocks(model)[layer]
    writers = []
    if branch in ("attention", "both"):
        writers += adapter.attn_writers(block)
    if branch in ("mlp", "both"):
        writers += adapter.mlp_writers(block)
    for writer in writers:
        writer.weight.mul_(factor)
        if getattr(writer, "bias", None) is not None:
            writer.bias.mul_(factor)


def weights_by_name(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """Every block linear's weight as (out, in), by 'layer.path'."""
    adapter = match_structure(model)
    return {
        f"{index}.{path}": weight_out_in(module).detach().clone()
        for index, block in enumerate(adapter.blocks(model))
        for path, module in block_linears(adapter, block)
    }
