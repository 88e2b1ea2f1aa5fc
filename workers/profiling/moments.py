"""What a profile accumulates per residual signal over the calibration batches: the second moments
slicing's basis and the energy shares come from, and the lens positions read through the head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workers.slicing.pca import SecondMoment


@dataclass
class _LensRows:
    """Where the lens positions sit in each calibration batch, and their next tokens."""

    rows: list[torch.Tensor]  # per batch: (n_b,) row indices (possibly empty)
    cols: list[torch.Tensor]  # per batch: (n_b,) position indices
    labels: torch.Tensor  # (n,) next-token ids, in batch order

    @classmethod
    def choose(cls, input_ids: torch.Tensor, keep: torch.Tensor, batch_size: int, budget: int) -> _LensRows:
        """`budget` positions spread evenly over every usable position of every window (a real token
        followed by a real one, the attention sink left out), so the readings see every window and
        both short and long contexts, not the first window's opening tokens alone."""
        usable = keep[:, :-1].bool() & keep[:, 1:].bool()  # (N, T - 1)
        usable[:, 0] = False  # the attention sink
        r_all, c_all = usable.nonzero(as_tuple=True)  # (U,), row-major
        count = min(budget, int(r_all.numel()))
        picked = ((torch.arange(count, dtype=torch.float64) + 0.5) * r_all.numel() / max(count, 1)).long()
        r_all, c_all = r_all[picked], c_all[picked]  # (n,), still in batch order
        rows, cols, labels = [], [], []
        for start in range(0, input_ids.shape[0], batch_size):
            inside = (r_all >= start) & (r_all < start + batch_size)
            r, c = r_all[inside] - start, c_all[inside]
            rows.append(r)
            cols.append(c)
            labels.append(input_ids[start + r, c + 1])
        return cls(rows, cols, torch.cat(labels))

    def gather(self, batch_index: int, signal: torch.Tensor) -> torch.Tensor:
        """The lens positions of one batch's signal (B, T, D) -> (n_b, D)."""
        rows, cols = self.rows[batch_index], self.cols[batch_index]
        return signal[rows.to(signal.device), cols.to(signal.device)]


class _Signal:
    """One signal's running moments over the batches, and its lens rows."""

    def __init__(self, width: int, compute: torch.device, centred: bool, measured: bool) -> None:
        """`measured`: the profile is measured on these windows, so they need the token energy's
        moment too; windows that only give the basis (separate measured windows) skip it."""
        self._raw = SecondMoment(width, compute)  # sum x x^T, in float64 as slicing sums it
        # float32 products summed in float64, half the time: the token energy is a share, which
        # they move by under 1e-6 relative on SmolLM2 (bench/README.md); the basis stays slicing's
        normalised = SecondMoment(width, compute, torch.float32) if measured else None
        self._normalised = normalised  # sum x x^T / |x|^2
        self.lens_rows: list[torch.Tensor] = []
        self.centred = centred

    @property
    def positions(self) -> int:
        return self._raw.positions

    @property
    def raw(self) -> torch.Tensor:
        """(D, D) float64: sum x x^T."""
        return self._raw.matrix

    @property
    def normalised(self) -> torch.Tensor:
        """(D, D) float64: sum x x^T / |x|^2 (only on the windows the profile is measured on)."""
        assert self._normalised is not None, "the token energy is measured on the measured windows"
        return self._normalised.matrix

    def add(self, hidden: torch.Tensor, keep: torch.Tensor, lens: torch.Tensor | None) -> None:
        """hidden (B, T, D), keep (B, T) bool, lens (n_b, D) the batch's lens rows (None: not
        gathered). Both moments are slicing's `SecondMoment`s (float64 sums), padded positions left out."""
        if self.centred:
            hidden = _centre(hidden)
            lens = None if lens is None else _centre(lens)
        self._raw.add(hidden, keep)
        if self._normalised is not None:
            self._normalised.add(hidden, keep, unit_rows=True)
        if lens is not None:
            self.lens_rows.append(lens.detach())


def _centre(x: torch.Tensor) -> torch.Tensor:
    return x - x.mean(dim=-1, keepdim=True)
