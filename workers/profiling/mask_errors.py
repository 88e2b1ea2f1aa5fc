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

Cost per linear and rule: one sort of its scores, then per sparsity one (out x in) @ (in x in)
product in float32 on the compute device. Memory: per distinct input of the block, one (in,)
float64 diagonal and one (in x in) float32 moment (as SparseGPT's Hessians), twice with separate
measured windows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from core.profiles import MASK_RULES
from workers.pruning.linears import weight_out_in
from workers.pruning.recording import InputStatistic, NewStatistic
from workers.pruning.stream import add_squares

MASK_TOKENS = 8192
"""Most tokens a linear's input moment C is estimated on (strided over the measured windows)."""

Order = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, bool]]
"""(W, ||X||^2 per input) -> (the pruning order of the weights: per row (out, in) or over the flat
layer (out * in,), and whether it is per row)."""


def _per_row(scores: torch.Tensor) -> tuple[torch.Tensor, bool]:
    return torch.sort(scores, dim=1, stable=True).indices, True


RULES: dict[str, Order] = {
    "wanda": lambda weight, squares: _per_row(weight.abs() * squares.sqrt()[None, :]),
    "magnitude": lambda weight, _squares: (torch.sort(weight.abs().flatten(), stable=True).indices, False),
    "magnitude-row": lambda weight, _squares: _per_row(weight.abs()),
}
assert tuple(RULES) == MASK_RULES, "every rule core.profiles names has its order here"


class MaskMoment:
    """A linear's input statistics for the mask errors: sum x_j^2 over every real token (float64,
    Wanda's ||X_j||^2) and sum x x^T over every `stride`-th one (float32)."""

    def __init__(self, features: int, device: torch.device, stride: int = 1) -> None:
        self.squares = torch.zeros(features, dtype=torch.float64, device=device)  # (in,)
        self.moment = torch.zeros(features, features, dtype=torch.float32, device=device)  # (in, in)
        self.stride = stride
        self.sampled = 0
        self._skip = 0  # real tokens to pass over before the next sampled one

    def add(self, rows: torch.Tensor, keep: torch.Tensor | None = None) -> None:
        """Add the token inputs `rows` (n, in); `keep` (n,) marks the real tokens (None: all)."""
        add_squares(self.squares, rows, keep)
        real = torch.arange(rows.shape[0], device=rows.device)  # (n,)
        if keep is not None:
            real = real[keep.to(rows.device)]  # (m,) the real tokens' rows
        picked = rows[real[self._skip :: self.stride]].float()  # (m', in): a copy of the sampled rows only
        self._skip = (self._skip - real.numel()) % self.stride
        self.moment.addmm_(picked.T, picked)
        self.sampled += picked.shape[0]

    @property
    def covariance(self) -> torch.Tensor:
        """C = sum x x^T / sampled tokens (in, in)."""
        return self.moment / max(self.sampled, 1)


def mask_moments(tokens: int, budget: int | None = None) -> NewStatistic:
    """The statistic factory for windows of `tokens` real tokens: strided to at most `budget`
    (default `MASK_TOKENS`)."""
    stride = max(1, math.ceil(tokens / (budget or MASK_TOKENS)))
    return lambda features, device: MaskMoment(features, device, stride)


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
        total = _energy(weight, covariance)
        errors = {}
        for rule in rules:
            order, per_row = RULES[rule](weight, squares.to(weight.device))
            pruned = [weight * _mask(order, per_row, weight.shape, s) for s in sparsities]
            errors[rule] = [_energy(dw, covariance) / total if total > 0 else 0.0 for dw in pruned]
        out.append(LinearError(layer, path, weight.shape[0], weight.shape[1], total, errors))
    return out


def _mask(order: torch.Tensor, per_row: bool, shape: torch.Size, sparsity: float) -> torch.Tensor:
    """True at the weights pruned first at `sparsity`: the first floor(s * in) of each row's order,
    or floor(s * out * in) of the layer's (the counts of `workers.pruning.masks`)."""
    rows, columns = shape
    mask = torch.zeros(rows, columns, dtype=torch.bool, device=order.device)
    if per_row:
        mask.scatter_(1, order[:, : math.floor(sparsity * columns + 1e-9)], True)
    else:
        mask.view(-1)[order[: math.floor(sparsity * rows * columns + 1e-9)]] = True
    return mask


def _moment(statistic: InputStatistic) -> MaskMoment:
    assert isinstance(statistic, MaskMoment)
    return statistic


def _energy(weight: torch.Tensor, moment: torch.Tensor) -> float:
    """tr(W M W^T) for W (out, in), M (in, in)."""
    return float(((weight @ moment) * weight).sum())
