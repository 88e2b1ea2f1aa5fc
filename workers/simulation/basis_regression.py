"""A sequential basis stream over a few calibration windows, corrected to every window by regression.

Why (measured in bench/README.md, "basis_windows.py"): a `sequential` stream (`workers.simulation.projection`)
costs a block pass per window and sparsity, and over fewer windows its bases fit those windows'
tokens, so the simulated curve lies above slicing's (0.225 off at 8 of 32 windows on SmolLM2). The
dense stream over every window, one pass that every sparsity shares, knows what the other windows
look like. On the subset both streams run over the same positions, so the projected signal p can be
regressed on the dense one x there, M = C_px (C_xx,sub + λ)⁻¹, and the dense stream's every-window
moment carried over:

    Ĉ = C_pp,sub + M (C_xx,all - C_xx,sub) Mᵀ          (means over positions)

This is the regression (control-variate) estimator of the projected stream's every-window moment.
Unlike the plain difference C_pp,sub + C_xx,all - C_xx,sub (M = I), which is not positive
semi-definite and on SmolLM2 turned the massive-activation direction's eigenvalue negative, Ĉ is:
Ĉ = (C_pp,sub - M C_xx,sub Mᵀ) + M C_xx,all Mᵀ, where the first term is at least the Schur complement
C_pp - C_px C_xx⁻¹ C_xp of the subset's joint moment for every λ ≥ 0. With every window in the subset
C_xx,all = C_xx,sub and Ĉ is C_pp, the plain sequential stream's moment, exactly.

Cost: per signal, the dense stream's moment over every window (shared), and per sparsity one D x D
cross moment over the subset and a D x D solve; the products run in float32 and are summed in
float64 (`SecondMoment`'s float32 mode).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workers.block_inputs import BlockBatch
from workers.slicing.pca import MOMENT_ROWS, SecondMoment

RIDGE = 1e-6
"""λ as a share of mean(diag C_xx,sub): only there to keep the solve defined; fixed before any bench."""


@dataclass
class DenseReference:
    """The dense calibration stream over every window; its first `subset` batches are the windows
    the corrected sequential streams hold. `whole` and `part` are its current signal's sums of x xᵀ
    over every window and over the subset, with their position counts."""

    batches: list[BlockBatch]
    subset: int
    whole: torch.Tensor | None = None  # (D, D) float64
    part: torch.Tensor | None = None  # (D, D) float64
    whole_positions: int = 0
    part_positions: int = 0


class CrossMoment:
    """Running sum of p xᵀ over the positions a mask keeps (p, x: two streams at the same positions),
    each chunk's product in float32 and summed in float64."""

    def __init__(self, width: int, device: torch.device) -> None:
        self.matrix = torch.zeros(width, width, dtype=torch.float64, device=device)  # (D, D)
        self.positions = 0

    def add(self, projected: torch.Tensor, dense: torch.Tensor, keep: torch.Tensor) -> None:
        """projected, dense (B, T, D); keep (B, T) bool."""
        rows_p = projected.reshape(-1, projected.shape[-1])
        rows_x = dense.reshape(-1, dense.shape[-1])
        kept = keep.reshape(-1).to(device=rows_p.device, dtype=torch.bool)
        for start in range(0, rows_p.shape[0], MOMENT_ROWS):
            mask = kept[start : start + MOMENT_ROWS].to(self.matrix.device)
            p = rows_p[start : start + MOMENT_ROWS].to(
                device=self.matrix.device, dtype=torch.float32, copy=True
            )
            x = rows_x[start : start + MOMENT_ROWS].to(
                device=self.matrix.device, dtype=torch.float32, copy=True
            )
            if not bool(mask.all()):
                p.masked_fill_(~mask[:, None], 0.0)
                x.masked_fill_(~mask[:, None], 0.0)
            self.matrix += (p.T @ x).double()
        self.positions += int(kept.sum())


def measure_reference(
    reference: DenseReference, signals: list[torch.Tensor], width: int, device: torch.device
) -> None:
    """The reference's moments of its current signal, `signals[i]` (B, T, D) being batch i's (centred
    where the family's bases are). The every-window sum is the subset's plus the rest's, so with no
    rest the two are the same tensor's values, bit for bit."""
    part = SecondMoment(width, device, products=torch.float32)
    rest = SecondMoment(width, device, products=torch.float32)
    for index, (batch, signal) in enumerate(zip(reference.batches, signals, strict=True)):
        (part if index < reference.subset else rest).add(signal, batch.keep)
    reference.part = part.matrix
    reference.part_positions = part.positions
    reference.whole = reference.part + rest.matrix if rest.positions else reference.part
    reference.whole_positions = part.positions + rest.positions


def regressed_moment(
    projected: torch.Tensor, projected_positions: int, cross: CrossMoment, reference: DenseReference
) -> torch.Tensor:
    """Ĉ (D, D) float64 as the module docstring says, from the subset stream's sum of p pᵀ over its
    `projected_positions`, its cross moment with the reference and the reference's moments."""
    assert reference.part is not None and reference.whole is not None
    if reference.whole_positions == reference.part_positions:
        return projected / projected_positions
    if cross.positions != reference.part_positions or projected_positions != cross.positions:
        raise ValueError("the subset stream and the reference's subset must hold the same positions")
    c_pp = projected / projected_positions
    c_px = cross.matrix / cross.positions
    c_sub = reference.part / reference.part_positions
    c_all = reference.whole / reference.whole_positions
    damped = c_sub.clone()
    damped.diagonal().add_(RIDGE * float(c_sub.diagonal().mean()))
    regression = torch.linalg.solve(damped, c_px.T).T  # M = C_px (C_sub + λ)⁻¹, (D, D)
    estimate = c_pp + regression @ (c_all - c_sub) @ regression.T
    return (estimate + estimate.T) / 2
