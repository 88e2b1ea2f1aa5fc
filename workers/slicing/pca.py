"""Step 5 of SliceGPT: principal directions of a residual-stream signal.

The second moment C = sum over non-padded positions of x^T x is accumulated in float64 and not
centred (the stream's mean is part of what the kept directions must carry). A damping of
1% of the mean diagonal is added before the eigendecomposition, whose eigenvectors, sorted by
decreasing eigenvalue, are the new basis Q (columns).
"""

from __future__ import annotations

import torch

DAMPING = 0.01  # fraction of mean(diag C) added to the diagonal before eigh


class SecondMoment:
    """Running C = sum X^T X over the positions an attention mask keeps."""

    def __init__(self, width: int, device: torch.device) -> None:
        self.matrix = torch.zeros(width, width, dtype=torch.float64, device=device)  # (D, D)
        self.positions = 0

    def add(self, signal: torch.Tensor, keep: torch.Tensor) -> None:
        """signal (B, T, D); keep (B, T) bool, False at padded positions."""
        keep = keep.to(device=self.matrix.device, dtype=torch.bool)
        x = signal.to(device=self.matrix.device, dtype=torch.float64)
        # masked_fill, not a product with the mask: padded positions may hold inf/nan that must not leak in
        x = x.masked_fill(~keep[..., None], 0.0)
        flat = x.reshape(-1, x.shape[-1])  # (B*T, D)
        self.matrix += flat.T @ flat
        self.positions += int(keep.sum())


def principal_basis(moment: torch.Tensor, damping: float = DAMPING) -> tuple[torch.Tensor, torch.Tensor]:
    """(eigenvalues descending, Q with matching eigenvector columns), both float64."""
    damped = moment.to(torch.float64).clone()
    damped.diagonal().add_(damping * damped.diagonal().mean())
    values, vectors = torch.linalg.eigh(damped)  # ascending
    order = torch.argsort(values, descending=True)
    return values[order], vectors[:, order]
