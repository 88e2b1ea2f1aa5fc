"""What each unstructured mask rule would cost every block linear, measured on the dense inputs
(docs/science.md, "Predicting before pruning", the intra-layer predictors).

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
model); the errors are measured on the windows the profile is measured on. Every block is dense
here, whereas the pruners pick block i's masks with blocks < i already pruned: e(s) is the local
cost of each linear, which the feature laws map to perplexity (`core.profiles`).

Cost per linear, rule and sparsity: one (out x in) @ (in x in) product, in float32 on the compute
device. Memory: one (in x in) float32 moment per distinct input of the block (as SparseGPT's
Hessians), twice with separate measured windows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from core.profiles import MASK_RULES
from workers.pruning.linears import weight_out_in
from workers.pruning.masks import layer_mask, unstructured_mask
from workers.pruning.recording import InputStatistic
from workers.pruning.sparsegpt import HessianAccumulator

MaskRule = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]  # (W, diag C, s) -> mask (out, in)

RULES: dict[str, MaskRule] = {
    "wanda": lambda weight, diagonal, s: unstructured_mask(weight.abs() * diagonal.sqrt()[None, :], s),
    "magnitude": lambda weight, _diagonal, s: layer_mask(weight.abs(), s),
    "magnitude-row": lambda weight, _diagonal, s: unstructured_mask(weight.abs(), s),
}
assert tuple(RULES) == MASK_RULES, "every rule core.profiles names has its mask here"


def new_moment(features: int, device: torch.device) -> HessianAccumulator:
    """A linear's input second moment (2 C, the SparseGPT Hessian; the factor cancels in e(s))."""
    return HessianAccumulator(features, device)


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
    moments), errors on `seen` (the measured windows', or the same)."""
    out = []
    for path, module in linears:
        basis_moment, seen_moment = _matrix(basis[path]), _matrix(seen[path])
        weight = weight_out_in(module).detach().to(device=seen_moment.device, dtype=torch.float32)
        diagonal = basis_moment.diagonal().clamp_min(0.0)  # (in,)
        total = _energy(weight, seen_moment)
        errors = {}
        for rule in rules:
            errors[rule] = [
                _energy(weight * RULES[rule](weight, diagonal, s), seen_moment) / total if total > 0 else 0.0
                for s in sparsities
            ]
        out.append(LinearError(layer, path, weight.shape[0], weight.shape[1], total / 2.0, errors))
    return out


def _matrix(statistic: InputStatistic) -> torch.Tensor:
    assert isinstance(statistic, HessianAccumulator)
    return statistic.matrix


def _energy(weight: torch.Tensor, moment: torch.Tensor) -> float:
    """tr(W M W^T) for W (out, in), M (in, in)."""
    return float(((weight @ moment) * weight).sum())
