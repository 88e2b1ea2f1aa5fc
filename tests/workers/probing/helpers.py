"""Pruned copies of tiny models and independent reference computations for the probing tests."""

from __future__ import annotations

import copy

import torch
from torch import nn

from workers.architectures import match_structure
from workers.slicing.portable.sliced_modules import get_path


def prune_copy(
    model: nn.Module,
    *,
    fraction: float = 0.5,
    seed: int = 0,
    branches: tuple[str, ...] = ("attention", "mlp"),
) -> nn.Module:
    """A copy with a random `fraction` of each chosen branch's linear weights set to zero."""
    pruned = copy.deepcopy(model)
    adapter = match_structure(pruned)
    paths: tuple[str, ...] = ()
    if "attention" in branches:
        paths += adapter.attn_reader_paths + adapter.attn_writer_paths
    if "mlp" in branches:
        paths += adapter.mlp_reader_paths + adapter.mlp_writer_paths
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for block in adapter.blocks(pruned):
            for path in paths:
                weight = get_path(block, path).weight
                weight.mul_((torch.rand(weight.shape, generator=generator) >= fraction).to(weight.dtype))
    return pruned


def prompt_ids(count: int = 2, length: int = 9, seed: int = 0, vocab: int = 256) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (length + index,), generator=generator) for index in range(count)]


def reference_metrics(x: torch.Tensor, x2: torch.Tensor) -> dict[str, tuple[float, float | None]]:
    """Mean over rows of 1-cos (F.cosine_similarity), dpar, dperp and alpha, written out independently."""
    x, x2 = x.double(), x2.double()
    dx = x2 - x
    one_minus_cos = 1 - torch.nn.functional.cosine_similarity(x, x2, dim=-1)
    unit = x / x.norm(dim=-1, keepdim=True)
    along = (dx * unit).sum(-1, keepdim=True) * unit
    across = dx - along
    norm = x.norm(dim=-1)
    return {
        "1-cos": (float(one_minus_cos.mean()), float((across.norm(dim=-1) ** 2 / (2 * norm**2)).mean())),
        "dpar": (float((along.norm(dim=-1) / norm).mean()), None),
        "dperp": (float((across.norm(dim=-1) / norm).mean()), None),
        "alpha": (float(((dx * x).sum(-1) / norm**2).mean()), None),
    }


def reference_probability_metrics(
    z: torch.Tensor, z2: torch.Tensor, temperature: float
) -> dict[str, tuple[float, float | None]]:
    """Mean over rows of 1-cos(p, q) and KL(p || q) (torch.distributions), with the estimates."""
    z, z2 = z.double(), z2.double()
    p, q = torch.softmax(z / temperature, -1), torch.softmax(z2 / temperature, -1)
    dz = z2 - z
    kl = torch.distributions.kl_divergence(
        torch.distributions.Categorical(probs=p), torch.distributions.Categorical(probs=q)
    )

    def variance(weights: torch.Tensor) -> torch.Tensor:
        weights = weights / weights.sum(-1, keepdim=True)
        mean = (weights * dz).sum(-1, keepdim=True)
        return (weights * dz**2).sum(-1) - mean.squeeze(-1) ** 2

    return {
        "1-cos": (
            float((1 - torch.nn.functional.cosine_similarity(p, q, dim=-1)).mean()),
            float((variance(p**2) / (2 * temperature**2)).mean()),
        ),
        "kl": (float(kl.mean()), float((variance(p) / (2 * temperature**2)).mean())),
    }
