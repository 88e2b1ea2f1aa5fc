"""How each intra-layer method prunes one linear: the statistic it reads and the rule it applies.

The pruning engine (`workers.pruning.engine`) walks the blocks and applies a method's rule to every
block linear; the simulation (`workers.simulation.masking`) applies the very same rule to a block for
the length of one forward and then puts the weights back. One table serves both, so a simulated mask
is the engine's mask by construction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from workers.pruning.linears import weight_out_in
from workers.pruning.magnitude import prune_linear_by_magnitude
from workers.pruning.recording import NewStatistic
from workers.pruning.sparsegpt import HessianAccumulator, sparsegpt_prune
from workers.pruning.wanda import FeatureSquares, prune_linear_by_wanda

PruneOne = Callable[[nn.Module, Any, float, str], torch.Tensor]
"""(linear, its input statistic or None, sparsity, pattern) -> the prune mask (out, in), in place."""


@dataclass(frozen=True)
class LinearRule:
    """One intra-layer method on one linear."""

    statistic: NewStatistic | None  # what it records of the linear's inputs; None: reads no data
    prune: PruneOne


def _magnitude(per_row: bool) -> PruneOne:
    def prune(module: nn.Module, _statistic: Any, sparsity: float, pattern: str) -> torch.Tensor:
        return prune_linear_by_magnitude(module, sparsity, pattern, per_row=per_row)

    return prune


def _wanda(module: nn.Module, statistic: Any, sparsity: float, pattern: str) -> torch.Tensor:
    return prune_linear_by_wanda(module, statistic, sparsity, pattern)


@torch.no_grad()
def _sparsegpt(module: nn.Module, statistic: Any, sparsity: float, pattern: str) -> torch.Tensor:
    weight = weight_out_in(module)  # (out, in), a view of the stored parameter
    new_weight, mask = sparsegpt_prune(weight, statistic.matrix, sparsity, pattern)
    weight.copy_(new_weight)
    return mask


LINEAR_RULES: dict[str, LinearRule] = {
    "magnitude": LinearRule(None, _magnitude(per_row=False)),
    "magnitude-row": LinearRule(None, _magnitude(per_row=True)),
    "wanda": LinearRule(FeatureSquares, _wanda),
    "sparsegpt": LinearRule(HessianAccumulator, _sparsegpt),
}
"""Every intra-layer method of `core.methods`, by name (checked by the engine's table)."""
