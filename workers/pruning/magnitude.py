"""Magnitude pruning: zero the weights with the smallest |W_ij|.

Unstructured masks compare weights within each output row (the same comparison group Wanda
uses, so the two differ only in the score), not across the whole layer as the classic
magnitude baseline does. N:M masks compare within each group of M input columns of a row.
No calibration data is needed.
"""

from __future__ import annotations

import torch
from torch import nn

from workers.pruning.linears import weight_out_in
from workers.pruning.masks import select_mask


def magnitude_scores(weight: torch.Tensor) -> torch.Tensor:
    """|W| (out, in): the smaller, the sooner pruned."""
    return weight.detach().abs().float()


@torch.no_grad()
def prune_linear_by_magnitude(module: nn.Module, sparsity: float, pattern: str) -> torch.Tensor:
    """Zero the lowest-|W| weights of one linear in place; return the prune mask (out, in)."""
    weight = weight_out_in(module)  # (out, in), a view of the stored parameter
    mask = select_mask(magnitude_scores(weight), sparsity, pattern)  # (out, in)
    weight.masked_fill_(mask, 0.0)
    return mask
