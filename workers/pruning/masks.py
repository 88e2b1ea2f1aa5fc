"""Which weights to zero, given a score per weight (lowest scores go first).

Patterns:
- "unstructured": in each output row, exactly floor(sparsity * in) weights with the lowest scores
  (per-row comparison groups, as in the Wanda paper; `magnitude-row` uses the same groups), or with
  `layer_mask` floor(sparsity * out * in) across the whole layer (the classic `magnitude`);
- "N:M" ("2:4", "4:8"): in each output row, N of every M consecutive input columns, so the
  sparsity is exactly N / M (the layout sparse tensor cores accelerate).

Ties are broken by torch.topk; the count per group is always exact.
"""

from __future__ import annotations

import math

import torch

UNSTRUCTURED = "unstructured"
PATTERNS: tuple[str, ...] = (UNSTRUCTURED, "2:4", "4:8")


def parse_pattern(pattern: str) -> tuple[int, int] | None:
    """(N, M) for an N:M pattern, None for unstructured. Raises ValueError naming the choices."""
    if pattern not in PATTERNS:
        raise ValueError(f"unknown sparsity pattern {pattern!r}; use one of: {', '.join(PATTERNS)}")
    if pattern == UNSTRUCTURED:
        return None
    n, m = (int(part) for part in pattern.split(":"))
    return n, m


def pattern_sparsity(pattern: str) -> float | None:
    """N / M for an N:M pattern (the only sparsity it can have), None for unstructured."""
    n_m = parse_pattern(pattern)
    return None if n_m is None else n_m[0] / n_m[1]


def pruned_count(sparsity: float, group: int) -> int:
    """floor(sparsity * group): how many of a group's weights are pruned, tolerating float products
    just under an integer (0.3 * 10 = 2.9999999999999996)."""
    return math.floor(sparsity * group + 1e-9)


def unstructured_mask(scores: torch.Tensor, sparsity: float) -> torch.Tensor:
    """True where a weight is pruned: the floor(sparsity * in) lowest scores of each row."""
    rows, columns = scores.shape  # (out, in)
    pruned = pruned_count(sparsity, columns)
    mask = torch.zeros(rows, columns, dtype=torch.bool, device=scores.device)  # (out, in)
    if pruned > 0:
        lowest = torch.topk(scores, pruned, dim=1, largest=False).indices  # (out, pruned)
        mask.scatter_(1, lowest, True)
    return mask


def layer_mask(scores: torch.Tensor, sparsity: float) -> torch.Tensor:
    """True where a weight is pruned: the floor(sparsity * out * in) lowest scores of the whole
    layer, one threshold for all its rows (the magnitude baseline of the Wanda and SparseGPT papers)."""
    pruned = pruned_count(sparsity, scores.numel())
    mask = torch.zeros(scores.numel(), dtype=torch.bool, device=scores.device)  # (out * in,)
    if pruned > 0:
        mask[torch.topk(scores.flatten(), pruned, largest=False).indices] = True
    return mask.reshape(scores.shape)


def n_m_mask(scores: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """True where a weight is pruned: the n lowest scores of every m consecutive input columns."""
    rows, columns = scores.shape  # (out, in)
    if columns % m:
        raise ValueError(
            f"an {n}:{m} pattern needs the input width to be a multiple of {m}; this linear has "
            f"{columns} input columns; use pattern 'unstructured' for it"
        )
    groups = scores.reshape(rows, columns // m, m)  # (out, in / m, m)
    lowest = torch.topk(groups, n, dim=2, largest=False).indices  # (out, in / m, n)
    mask = torch.zeros_like(groups, dtype=torch.bool).scatter_(2, lowest, True)  # (out, in / m, m)
    return mask.reshape(rows, columns)


def select_mask(scores: torch.Tensor, sparsity: float, pattern: str) -> torch.Tensor:
    """The prune mask (out, in) for `pattern`; N:M ignores `sparsity` (validated elsewhere as N/M)."""
    n_m = parse_pattern(pattern)
    if n_m is None:
        return unstructured_mask(scores, sparsity)
    return n_m_mask(scores, *n_m)
