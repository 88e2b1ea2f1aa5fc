"""Step 5 of SliceGPT: principal directions of a residual-stream signal.

The second moment C = sum over non-padded positions of x^T x is accumulated in float64 and not
centred (the stream's mean is part of what the kept directions must carry). A damping of
1% of the mean diagonal is added before the eigendecomposition, whose eigenvectors, sorted by
decreasing eigenvalue, are the new basis Q (columns).
"""

from __future__ import annotations

import torch

DAMPING = 0.01  # fraction of mean(diag C) added to the diagonal before eigh
MOMENT_ROWS = 1024  # positions per chunk (4.7 MB at D = 576, 66 MB at D = 8192)
MOMENT_BLOCKS = 4  # column blocks of C; only those on and below the diagonal are computed


class SecondMoment:
    """Running C = sum X^T X over the positions an attention mask keeps.

    Only the blocks on and below the diagonal of MOMENT_BLOCKS x MOMENT_BLOCKS column blocks are
    accumulated (C is symmetric): 10 of 16 block products, the same float64 sums, about 25 % less
    time than the full product on the CPU; `matrix` mirrors them into the full C."""

    def __init__(self, width: int, device: torch.device, products: torch.dtype = torch.float64) -> None:
        """`products`: the dtype each chunk's product is computed in before it joins the float64
        sums. float64 is slicing's (the reference's); float32 halves the time on a CPU and leaves
        each entry off by the float32 rounding of a MOMENT_ROWS-term sum (a few 1e-7 relative),
        which the profile accepts (bench/README.md measured what it does to the spectra). A float32
        chunk's product is taken whole, not block by block: on SmolLM2's width one whole float32
        product took 0.76x the ten float64 block products (bench/README.md, `moment_products.py`)."""
        self._lower = torch.zeros(width, width, dtype=torch.float64, device=device)  # (D, D), lower blocks
        self._products = products
        self.positions = 0
        step = -(-width // MOMENT_BLOCKS)
        self._edges = [(start, min(start + step, width)) for start in range(0, width, step)]

    @property
    def matrix(self) -> torch.Tensor:
        """C (D, D) float64, symmetric."""
        lower = self._lower
        upper_blocks = torch.ones_like(lower, dtype=torch.bool)
        for start, end in self._edges:
            upper_blocks[start:, start:end] = False  # the accumulated blocks
        return torch.where(upper_blocks, lower.T, lower)

    def add(self, signal: torch.Tensor, keep: torch.Tensor, unit_rows: bool = False) -> None:
        """signal (B, T, D); keep (B, T) bool, False at padded positions; `unit_rows`: each position
        divided by its norm first (sum x x^T / |x|^2). Runs on chunks of MOMENT_ROWS positions, so
        its copies stay small whatever the batch."""
        rows = signal.reshape(-1, signal.shape[-1])  # (B*T, D)
        kept = keep.reshape(-1).to(device=rows.device, dtype=torch.bool)  # (B*T,)
        for start in range(0, rows.shape[0], MOMENT_ROWS):
            part = rows[start : start + MOMENT_ROWS]
            x = part.to(device=self._lower.device, dtype=self._products, copy=True)  # (rows, D)
            mask = kept[start : start + MOMENT_ROWS].to(self._lower.device)
            if not bool(mask.all()):  # masked_fill, not a product: padded positions may hold inf/nan
                x.masked_fill_(~mask[:, None], 0.0)
            if unit_rows:
                x /= x.norm(dim=-1, keepdim=True).clamp_min(1e-30)
            if self._products != torch.float64:  # one whole product (0.76x the float64 blocks)
                self._lower += (x.T @ x).double()  # `matrix` reads its lower blocks only
                continue
            for begin, end in self._edges:  # column block j: rows j.. of C's block column j
                self._lower[begin:, begin:end].addmm_(x[:, begin:].T, x[:, begin:end])
        self.positions += int(kept.sum())


def principal_basis(moment: torch.Tensor, damping: float = DAMPING) -> tuple[torch.Tensor, torch.Tensor]:
    """(eigenvalues descending, Q with matching eigenvector columns), both float64."""
    damped = moment.to(torch.float64).clone()
    damped.diagonal().add_(damping * damped.diagonal().mean())
    values, vectors = torch.linalg.eigh(damped)  # ascending
    order = torch.argsort(values, descending=True)
    return values[order], vectors[:, order]
