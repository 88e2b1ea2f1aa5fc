"""Accessors for the linears and embeddings that read or write the residual stream, whatever layout
their weights are stored in (nn.Linear [out, in]; GPT-2's Conv1D [in, out]).

Portable: imports only torch and transformers, so exported checkpoints can carry this file.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

ReadWriteModule = nn.Linear | Conv1D


def tensor_of(module: nn.Module, name: str) -> torch.Tensor:
    """A module's parameter or buffer by name (typed, unlike nn.Module attribute access)."""
    value = getattr(module, name)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{type(module).__name__}.{name} is not a tensor")
    return value


def bias_of(module: nn.Module) -> torch.Tensor | None:
    value = getattr(module, "bias", None)
    return value if isinstance(value, torch.Tensor) else None


def weight_out_in(module: nn.Module) -> torch.Tensor:
    """The weight as [out, in], whatever the module stores."""
    if isinstance(module, Conv1D):
        return module.weight.t()
    if isinstance(module, nn.Linear):
        return module.weight
    raise TypeError(f"expected nn.Linear or Conv1D, got {type(module).__name__}")


def set_weight_out_in(module: nn.Module, weight: torch.Tensor) -> None:
    """Replace the weight (given as [out, in]) and update the shape attributes the module uses."""
    old = tensor_of(module, "weight")
    if isinstance(module, Conv1D):
        stored = weight.t().contiguous()
        module.nx, module.nf = stored.shape
    elif isinstance(module, nn.Linear):
        stored = weight.contiguous()
        module.out_features, module.in_features = stored.shape
    else:
        raise TypeError(f"expected nn.Linear or Conv1D, got {type(module).__name__}")
    module.weight = nn.Parameter(
        stored.to(device=old.device, dtype=old.dtype), requires_grad=old.requires_grad
    )


def set_bias(module: nn.Module, bias: torch.Tensor, like: torch.Tensor) -> None:
    """Replace (or add) the bias, stored with the dtype and device of `like`."""
    module.bias = nn.Parameter(
        bias.to(device=like.device, dtype=like.dtype), requires_grad=like.requires_grad
    )


def set_embedding(embedding: nn.Embedding, table: torch.Tensor) -> None:
    old = tensor_of(embedding, "weight")
    embedding.weight = nn.Parameter(
        table.contiguous().to(device=old.device, dtype=old.dtype), requires_grad=old.requires_grad
    )
    embedding.embedding_dim = table.shape[1]
