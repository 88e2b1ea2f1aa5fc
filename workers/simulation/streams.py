"""Windows on their way through the blocks, and their perplexity once past the last one.

A simulation runs several copies of the same windows at once, one per simulated sparsity: each copy
holds its own hidden states and shares the batches' other block arguments (masks, rotary tables),
which do not change along the stream.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from workers.block_inputs import BlockBatch
from workers.probing.head import Float32Head

NLL_TOKENS = 512
"""Positions read through the head at once: (NLL_TOKENS, V) float32 logits, 537 MB at V = 262k."""


def batches_holding(batches: list[BlockBatch], windows: int | None) -> int:
    """How many of the first batches hold the first `windows` sequences (all: None); a batch is never
    cut, so `windows` is rounded up to whole batches."""
    if windows is None:
        return len(batches)
    taken = 0
    for count, batch in enumerate(batches, start=1):
        taken += batch.hidden.shape[0]
        if taken >= windows:
            return count
    return len(batches)


def fork(batches: list[BlockBatch]) -> list[BlockBatch]:
    """Copies of the batches, their hidden states cloned and their calls shared."""
    return [replace(batch, hidden=batch.hidden.clone()) for batch in batches]


def sequences(batches: list[BlockBatch]) -> int:
    return sum(batch.hidden.shape[0] for batch in batches)


@dataclass(frozen=True)
class WindowScores:
    """Summed next-token NLL per window (float64) and the positions each sums over."""

    nll: torch.Tensor  # (W,) float64
    tokens_per_window: int

    @property
    def nll_mean(self) -> float:
        return float(self.nll.sum()) / (self.nll.numel() * self.tokens_per_window)

    @property
    def ppl(self) -> float:
        return math.exp(self.nll_mean)

    @property
    def tokens(self) -> int:
        return self.nll.numel() * self.tokens_per_window

    @property
    def per_window(self) -> list[float]:
        """Each window's mean next-token NLL (their mean is ln PPL: every window scores as many tokens)."""
        return (self.nll / self.tokens_per_window).tolist()


@torch.no_grad()
def score_windows(head: Float32Head, batches: list[BlockBatch], ids: torch.Tensor) -> WindowScores:
    """The final hidden states of `batches` (B, T, D) each, read through the float32 final norm and head,
    scored against `ids` (W, T) as the perplexity protocol does: position t predicts token t + 1."""
    sums = []
    start = 0
    for batch in batches:
        for row in range(batch.hidden.shape[0]):
            hidden = batch.hidden[row, :-1]  # (T-1, D)
            targets = ids[start + row, 1:].to(head.device)  # (T-1,)
            total = torch.zeros((), dtype=torch.float64)
            for begin in range(0, hidden.shape[0], NLL_TOKENS):
                logits = head(hidden[begin : begin + NLL_TOKENS])  # (n, V) float32
                nll = F.cross_entropy(logits, targets[begin : begin + NLL_TOKENS], reduction="none")
                total += nll.double().sum().cpu()
            sums.append(total)
        start += batch.hidden.shape[0]
    nll = torch.stack(sums) if sums else torch.zeros(0, dtype=torch.float64)  # a pass that scored none
    return WindowScores(nll, int(ids.shape[1]) - 1)
