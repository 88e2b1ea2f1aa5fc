"""Wanda (Sun et al., 2023): prune by |W_ij| * ||X_j||_2.

X_j is input feature j of the linear over every calibration token that reaches it (padded
positions excluded), measured with the earlier blocks already pruned. A weight on a feature with
large activations matters more than its magnitude alone says. Weights compete within their output
row (unstructured) or within each group of M input columns of a row (N:M), as in the paper.
"""

from __future__ import annotations

import torch
from torch import nn

from workers.pruning.linears import weight_out_in
from workers.pruning.masks import select_mask
from workers.pruning.stream import add_squares


class FeatureSquares:
    """Running sum over tokens of x_j^2 per input feature j, accumulated in float64.

    Memory: the (in,) sums plus one float32 chunk of rows (`stream.ROW_CHUNK_ELEMENTS`).
    """

    def __init__(self, features: int, device: torch.device) -> None:
        self.sums = torch.zeros(features, dtype=torch.float64, device=device)  # (in,)
        self.tokens = 0

    def add(self, rows: torch.Tensor, keep: torch.Tensor | None = None) -> None:
        """Add the token inputs `rows` (n, in); `keep` (n,) marks the real tokens (None: all)."""
        add_squares(self.sums, rows, keep)
        self.tokens += rows.shape[0] if keep is None else int(keep.sum())

    @property
    def norms(self) -> torch.Tensor:
        """||X_j||_2 per input feature: (in,)."""
        return self.sums.sqrt()


def wanda_scores(weight: torch.Tensor, input_norms: torch.Tensor) -> torch.Tensor:
    """|W_ij| * ||X_j||_2: weight (out, in), input_norms (in,) -> scores (out, in)."""
    return weight.detach().abs().double() * input_norms.double().to(weight.device)[None, :]  # (out, in)


@torch.no_grad()
def prune_linear_by_wanda(
    module: nn.Module, statistics: FeatureSquares, sparsity: float, pattern: str
) -> torch.Tensor:
    """Zero the lowest-scoring weights of one linear in place; return the prune mask (out, in)."""
    weight = weight_out_in(module)  # (out, in), a view of the stored parameter
    mask = select_mask(wanda_scores(weight, statistics.norms), sparsity, pattern)  # (out, in)
    weight.masked_fill_(mask, 0.0)
    return mask
