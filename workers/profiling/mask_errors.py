"""What each unstructured mask rule would cost every block linear, measured on the dense inputs
(docs/science.md, "Predicting the intra-layer pruners before pruning").

For a linear W (out, in) with input second moment C = X X^T / n over the tokens it reads, zeroing
the weights a mask M selects changes its output by dW X with dW = W * M, so the share of the output
energy lost is

    e(s) = tr(dW C dW^T) / tr(W C W^T)

exactly (correlated inputs included), for the mask a rule picks at sparsity s:

- `wanda`: the floor(s * in) lowest |W_ij| * ||X_j|| of each output row (Wanda's scores and groups;
  also what the profile offers SparseGPT, whose reconstruction only lowers this error);
- `magnitude`: the floor(s * out * in) lowest |W_ij| of the whole layer (the papers' magnitude);
- `magnitude-row`: the floor(s * in) lowest |W_ij| of each output row.

The masks come from the calibration windows' statistics (as the pruner would pick them on the dense
model): ||X_j|| over every calibration token, as Wanda reads it. The errors are measured on the
windows the profile is measured on, with C estimated on at most `MASK_TOKENS` of their tokens, every
k-th one (k = tokens / MASK_TOKENS rounded up): a full moment per linear input over every token
would cost more than the dense pass itself (4 in^2 flops per token and distinct input), and e(s) is
a mean over tokens, which a few thousand of them pin to about a percent. Every block is dense here,
whereas the pruners pick block i's masks with blocks < i already pruned: e(s) is the local cost of
each linear, which the feature laws map to perplexity (`core.profiles`).

Cost per linear and rule: one radix sort of its scores (`pruning_ranks`), then one float32 product of
every sparsity's masked weights with C, chunked by rows: (S out x in) @ (in x in), of which only C's
upper block triangle is multiplied (about 0.6 of the multiply-adds for in >= 1024; the diagonal
blocks once, the others twice), on the compute device. Memory: per distinct input of the block, one
(in,) float64 diagonal and one (in x in) float64 moment (as SparseGPT's Hessians; windows that only
pick the masks keep no moment); per linear, its scores and ranks (out x in) and one chunk of masked rows
(at most ROW_CHUNK_BYTES) with its product.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from core.profiles import MASK_RULES
from workers.pruning.linears import weight_out_in
from workers.pruning.masks import pruned_count
from workers.pruning.recording import InputStatistic, NewStatistic
from workers.pruning.stream import add_squares
from workers.pruning.wanda import wanda_scores
from workers.slicing.pca import SecondMoment

MASK_TOKENS = 8192
"""Most tokens a linear's input moment C is estimated on (strided over the measured windows)."""


@dataclass(frozen=True)
class Rule:
    """A mask rule: a non-negative score per weight (the lowest are pruned first) and its groups."""

    score: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (W (out, in), ||X||^2 (in,)) -> (out, in)
    per_row: bool  # each output row is a group (else the whole layer is one)


RULES: dict[str, Rule] = {
    "wanda": Rule(lambda weight, squares: wanda_scores(weight, squares.sqrt()), per_row=True),
    "magnitude": Rule(lambda weight, _squares: weight.abs(), per_row=False),
    "magnitude-row": Rule(lambda weight, _squares: weight.abs(), per_row=True),
}
assert tuple(RULES) == MASK_RULES, "every rule core.profiles names has its scores here"

ROW_CHUNK_BYTES = 64 * 2**20
"""Most bytes of one chunk of masked weight rows (every sparsity of one rule at once), so that a
large layer's (sparsities, out, in) stack never exists whole."""

MIN_BLOCK_COLUMNS = 256
"""Narrowest column block of the symmetric quadratic forms: narrower blocks make GEMMs too thin to
run at speed."""


class MaskMoment:
    """A linear's input statistics for the mask errors: sum x_j^2 over every real token (float64,
    Wanda's ||X_j||^2) and, unless `squares_only`, sum x x^T over every `stride`-th one (slicing's
    `SecondMoment`: the blocks on and below the diagonal, float32 products in float64 sums)."""

    def __init__(
        self, features: int, device: torch.device, stride: int = 1, squares_only: bool = False
    ) -> None:
        self.squares = torch.zeros(features, dtype=torch.float64, device=device)  # (in,)
        self._moment = None if squares_only else SecondMoment(features, device, torch.float32)
        self.stride = stride
        self._skip = 0  # real tokens to pass over before the next sampled one

    def add(self, rows: torch.Tensor, keep: torch.Tensor | None = None) -> None:
        """Add the token inputs `rows` (n, in); `keep` (n,) marks the real tokens (None: all)."""
        add_squares(self.squares, rows, keep)
        if self._moment is None:
            return
        real = torch.arange(rows.shape[0], device=rows.device)  # (n,)
        if keep is not None:
            real = real[keep.to(rows.device)]  # (m,) the real tokens' rows
        picked = rows[real[self._skip :: self.stride]]  # (m', in): a copy of the sampled rows only
        self._skip = (self._skip - real.numel()) % self.stride
        self._moment.add(picked[None], torch.ones(1, picked.shape[0], dtype=torch.bool))

    @property
    def sampled(self) -> int:
        """Tokens the moment has summed."""
        return 0 if self._moment is None else self._moment.positions

    @property
    def covariance(self) -> torch.Tensor:
        """C = sum x x^T / sampled tokens (in, in) float32."""
        assert self._moment is not None, "a squares-only statistic has no moment"
        return (self._moment.matrix / max(self.sampled, 1)).float()


def mask_moments(tokens: int, budget: int | None = None, squares_only: bool = False) -> NewStatistic:
    """The statistic factory for windows of `tokens` real tokens: strided to at most `budget`
    (default `MASK_TOKENS`); `squares_only` for windows that only pick the masks (the errors are
    measured on others)."""
    stride = max(1, math.ceil(tokens / (budget or MASK_TOKENS)))
    return lambda features, device: MaskMoment(features, device, stride, squares_only)


@dataclass(frozen=True)
class LinearError:
    """One block linear: its output energy and, per rule, e(s) at each profiled sparsity."""

    layer: int
    name: str  # the linear's path in its block, e.g. "self_attn.q_proj"
    rows: int
    columns: int
    output_energy: float  # tr(W C W^T): mean squared output norm per token
    errors: dict[str, list[float]]  # rule -> e(s) per sparsity


@torch.no_grad()
def linear_errors(
    layer: int,
    linears: list[tuple[str, torch.nn.Module]],
    basis: dict[str, InputStatistic],
    seen: dict[str, InputStatistic],
    sparsities: Sequence[float],
    rules: Sequence[str] = MASK_RULES,
) -> list[LinearError]:
    """e(s) of every rule for the block's linears: masks from `basis` (the calibration windows'
    statistics), errors on `seen` (the measured windows', or the same)."""
    out = []
    for path, module in linears:
        squares, covariance = _moment(basis[path]).squares, _moment(seen[path]).covariance
        weight = weight_out_in(module).detach().to(device=covariance.device, dtype=torch.float32)
        total = float(quadratic_forms(weight, covariance).sum())
        errors = {}
        for name in rules:
            rule = RULES[name]
            ranks = pruning_ranks(rule.score(weight, squares.to(weight.device)), rule.per_row)
            energies = _masked_energies(
                weight, ranks, _pruned_counts(rule.per_row, weight.shape, sparsities), covariance
            )
            errors[name] = [energy / total if total > 0 else 0.0 for energy in energies]
        out.append(LinearError(layer, path, weight.shape[0], weight.shape[1], total, errors))
    return out


_SAME_WIDTH_INTEGER = {torch.float32: torch.int32, torch.float64: torch.int64}  # for `pruning_ranks`


def pruning_ranks(scores: torch.Tensor, per_row: bool) -> torch.Tensor:
    """rank[r, j] (out, in): where weight (r, j) comes in its group's pruning order, 0 first; equal
    scores go in index order. Non-negative floats order as their bit patterns do, and torch sorts
    integer keys by radix: on a CPU several times faster than sorting the floats themselves."""
    keys = scores.contiguous().view(_SAME_WIDTH_INTEGER[scores.dtype])  # (out, in)
    keys = keys if per_row else keys.view(-1)  # (out, in) or (out * in,)
    order = torch.sort(keys, dim=-1, stable=True).indices
    ranks = torch.empty_like(order)
    positions = torch.arange(order.shape[-1], device=order.device)
    ranks.scatter_(-1, order, positions.expand_as(order))
    return ranks.view(scores.shape)


def _pruned_counts(per_row: bool, shape: torch.Size, sparsities: Sequence[float]) -> list[int]:
    """How many weights each group loses at each sparsity: floor(s * in) per row, or
    floor(s * out * in) per layer (the counts of `workers.pruning.masks`)."""
    group = shape[1] if per_row else shape[0] * shape[1]
    return [pruned_count(s, group) for s in sparsities]


def _masked_energies(
    weight: torch.Tensor, ranks: torch.Tensor, counts: list[int], moment: torch.Tensor
) -> list[float]:
    """tr(dW C dW^T) per sparsity for dW = W at the weights ranked below each count: every
    sparsity's masked rows of one chunk in one stacked product."""
    rows, columns = weight.shape
    limits = torch.tensor(counts, device=ranks.device)[:, None, None]  # (S, 1, 1)
    energies = torch.zeros(len(counts), dtype=torch.float64, device=weight.device)  # (S,)
    step = max(1, ROW_CHUNK_BYTES // (len(counts) * columns * weight.element_size()))
    for start in range(0, rows, step):
        chunk = slice(start, start + step)
        masked = torch.where(ranks[chunk] < limits, weight[chunk], 0.0)  # (S, c, in)
        forms = quadratic_forms(masked.view(-1, columns), moment)  # (S * c,)
        energies += forms.view(len(counts), -1).double().sum(dim=1)
    return energies.tolist()


def quadratic_forms(rows: torch.Tensor, moment: torch.Tensor) -> torch.Tensor:
    """x C x^T for every row x of `rows` (m, in), C (in, in) symmetric. C's upper block triangle
    only: the diagonal blocks once, the blocks right of them twice (with B column blocks, (B + 1) /
    2B of the multiply-adds of rows @ C)."""
    columns = rows.shape[1]
    blocks = max(1, columns // MIN_BLOCK_COLUMNS)
    edges = [round(i * columns / blocks) for i in range(blocks + 1)]
    forms = torch.zeros(rows.shape[0], dtype=rows.dtype, device=rows.device)  # (m,)
    for low, high in itertools.pairwise(edges):
        product = rows[:, low:high] @ moment[low:high, low:]  # (m, in - low)
        forms += (product[:, : high - low] * rows[:, low:high]).sum(dim=1)
        if high < columns:
            forms += 2 * (product[:, high - low :] * rows[:, high:]).sum(dim=1)
    return forms


def _moment(statistic: InputStatistic) -> MaskMoment:
    assert isinstance(statistic, MaskMoment)
    return statistic
