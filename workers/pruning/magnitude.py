"""Magnitude pruning: zero the weights with the smallest |W_ij|.

Two comparison groups for unstructured masks, two methods of the registry:
- `magnitude`: one threshold per layer, the smallest floor(s * out * in) of the whole linear, as the
  magnitude baseline of the Wanda and SparseGPT papers defines it (rows end up unevenly sparse);
- `magnitude-row`: the smallest floor(s * in) of each output row, Wanda's grouping, so that it and
  Wanda differ only in the score.
N:M masks compare within each group of M input columns of a row, whichever the method. No
calibration data is needed.
"""

from __future__ import annotations

import torch
from torch import nn

from workers.pruning.linears import weight_out_in
from workers.pruning.masks import UNSTRUCTURED, layer_mask, select_mask


def magnitude_scores(weight: torch.Tensor) -> torch.Tensor:
    """|W| (out, in): the smaller, the sooner pruned."""
    return weight.detach().abs().float()


@torch.no_grad()
def prune_linear_by_magnitude(
    module: nn.Module, sparsity: float, pattern: str, *, per_row: bool = False
) -> torch.Tensor:
    """Zero the lowest-|W| weights of one linear in place, across the layer (or, `per_row`, within
    each output row); return the prune mask (out, in)."""
    weight = weight_out_in(module)  # (out, in), a view of the stored parameter
    scores = magnitude_scores(weight)
    if pattern == UNSTRUCTURED and not per_row:
        mask = layer_mask(scores, sparsity)  # (out, in)
    else:
        mask = select_mask(scores, sparsity, pattern)  # (out, in)
    weight.masked_fill_(mask, 0.0)
    return mask
