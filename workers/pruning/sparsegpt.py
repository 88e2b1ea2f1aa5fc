"""SparseGPT (Frantar & Alistarh, 2023): prune one linear and let the kept weights make up for it.

For a linear with inputs X (in, n), the layer-wise objective is ||W X - W' X||_F^2 with Hessian
H = 2/n X X^T. Columns are processed left to right in blocks of `blocksize`; when column i is
fixed (some of its weights set to zero), the error e = (w - q) / [H^-1]_ii is spread over the
columns not yet fixed through the row i of the upper Cholesky factor of H^-1 (the OBS update).
Weights are chosen by w^2 / [chol(H^-1)]_ii^2.

Mask selection, and how it differs from the reference implementation:
- unstructured: as the reference, one comparison over the whole (out x blocksize) block, so rows
  get different counts (the block decides where its error is cheapest). The reference takes a
  threshold, which makes the achieved fraction approximate; here the block prunes exactly its
  share, out * (floor(s * end) - floor(s * start)) lowest scores for columns [start, end), so the
  layer ends with exactly out * floor(s * in) zeros. (A per-row choice, tried first, left a 8%
  larger reconstruction error on a correlated test layer at 50%.)
- N:M: as the reference, at each group of M columns, per row, the N lowest scores (scores taken
  after the updates from earlier columns), so every row has exactly N zeros per group.
"""

from __future__ import annotations

import math

import torch

from workers.pruning.masks import parse_pattern, pruned_count
from workers.pruning.stream import row_chunks


class HessianAccumulator:
    """H = 2/n sum_t x_t x_t^T over the n tokens seen so far (a running mean, as the reference).

    Memory: the (in, in) matrix plus one chunk of rows in its dtype (`stream.ROW_CHUNK_ELEMENTS`);
    the reference converts a batch's whole (tokens, in) input at once.
    """

    def __init__(self, features: int, device: torch.device, dtype: torch.dtype = torch.float32) -> None:
        self.matrix = torch.zeros(features, features, dtype=dtype, device=device)  # (in, in)
        self.tokens = 0

    def add(self, rows: torch.Tensor, keep: torch.Tensor | None = None) -> None:
        """Add the token inputs `rows` (n, in); `keep` (n,) marks the real tokens (None: all)."""
        added = rows.shape[0] if keep is None else int(keep.sum())
        if added == 0:
            return
        total = self.tokens + added
        self.matrix *= self.tokens / total
        scale = math.sqrt(2.0 / total)
        for chunk in row_chunks(rows, keep, self.matrix.dtype):
            chunk *= scale  # (rows, in)
            self.matrix.addmm_(chunk.T, chunk)  # (in, in)
        self.tokens = total


def _upper_cholesky_of_inverse(hessian: torch.Tensor) -> torch.Tensor:
    """U with U^T U = H^-1 (upper triangular)."""
    lower, info = torch.linalg.cholesky_ex(hessian)
    if int(info) != 0:
        raise ValueError(
            "the damped Hessian is not positive definite (too few calibration tokens for this width, "
            "or float32 round-off); raise damp or calibrate on more tokens"
        )
    inverse = torch.cholesky_inverse(lower)  # (in, in)
    upper, info = torch.linalg.cholesky_ex(inverse, upper=True)
    if int(info) != 0:
        raise ValueError("the inverse Hessian is not positive definite; raise damp or use float64 statistics")
    return upper


@torch.no_grad()
def sparsegpt_prune(
    weight: torch.Tensor,
    hessian: torch.Tensor,
    sparsity: float,
    pattern: str = "unstructured",
    blocksize: int = 128,
    damp: float = 0.01,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prune `weight` (out, in) given its inputs' Hessian (in, in): return (new weight, mask).

    The new weight has weight's dtype and device and zeros exactly where mask (out, in) is True.
    Arithmetic runs in the Hessian's dtype (float32 or float64). Inputs never active (diag 0) get
    diag 1 and their weight column is zeroed. Damping adds `damp` times the mean diagonal.
    """
    rows, columns = weight.shape
    if hessian.shape != (columns, columns):
        raise ValueError(
            f"hessian must be ({columns}, {columns}) for a weight of shape {tuple(weight.shape)}"
        )
    n_m = parse_pattern(pattern)
    if n_m is not None and (columns % n_m[1] or blocksize % n_m[1]):
        raise ValueError(
            f"pattern {pattern} needs the input width ({columns}) and blocksize ({blocksize}) to be "
            f"multiples of {n_m[1]}"
        )
    dtype = hessian.dtype
    work = weight.detach().to(device=hessian.device, dtype=dtype).clone()  # (out, in)
    hessian = hessian.clone()  # (in, in)
    dead = torch.diag(hessian) == 0  # (in,)
    hessian[dead, dead] = 1.0
    work[:, dead] = 0.0
    diagonal = torch.arange(columns, device=hessian.device)
    hessian[diagonal, diagonal] += damp * torch.mean(torch.diag(hessian))
    hinv = _upper_cholesky_of_inverse(hessian)  # (in, in), upper

    mask = torch.zeros(rows, columns, dtype=torch.bool, device=hessian.device)  # (out, in)
    for start in range(0, columns, blocksize):
        end = min(start + blocksize, columns)
        count = end - start
        block = work[:, start:end].clone()  # (out, count)
        errors = torch.zeros_like(block)  # (out, count)
        hinv_block = hinv[start:end, start:end]  # (count, count)
        block_diag = torch.diag(hinv_block)  # (count,)
        block_mask = torch.zeros(rows, count, dtype=torch.bool, device=block.device)  # (out, count)
        if n_m is None:
            pruned = rows * (pruned_count(sparsity, end) - pruned_count(sparsity, start))
            if pruned > 0:
                scores = block.pow(2) / block_diag[None, :].pow(2)  # (out, count)
                lowest = torch.topk(scores.flatten(), pruned, largest=False).indices  # (pruned,)
                block_mask.view(-1)[lowest] = True
        for i in range(count):
            column = block[:, i]  # (out,)
            if n_m is not None and i % n_m[1] == 0:
                n, m = n_m
                scores = block[:, i : i + m].pow(2) / block_diag[None, i : i + m].pow(2)  # (out, m)
                lowest = torch.topk(scores, n, dim=1, largest=False).indices  # (out, n)
                block_mask.scatter_(1, i + lowest, True)
            kept = column.masked_fill(block_mask[:, i], 0.0)  # (out,)
            error = (column - kept) / hinv_block[i, i]  # (out,)
            block[:, i:] -= error[:, None] @ hinv_block[i, i:][None, :]  # (out, count - i)
            block[:, i] = kept
            errors[:, i] = error
        work[:, start:end] = block
        work[:, end:] -= errors @ hinv[start:end, end:]  # (out, in - end)
        mask[:, start:end] = block_mask
    work.masked_fill_(mask, 0.0)  # exact zeros (the update leaves pruned entries at 0 already)
    return work.to(device=weight.device, dtype=weight.dtype), mask.to(weight.device)
