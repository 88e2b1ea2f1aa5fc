"""The two modules a sliced model contains that stock transformers models do not.

- `RMSNormNoScale` replaces every norm once its scale (and bias) is folded into the linears that
  read it. It divides by the root mean square over the ORIGINAL width D even after the residual
  stream is sliced to d < D: the kept coordinates carry almost all of the energy, and dividing by
  D keeps the output on the scale the readers were trained for.
- `SkipConnectedBlock` (sequential blocks) and `ParallelSkipConnectedBlock` (parallel-residual
  blocks) wrap one decoder block so that each residual add reads `x @ S` instead of `x`: after
  slicing, the stream entering a block lives in a different basis (and maybe width) from the one
  its branches write, and S maps one to the other.

A known difference from the dense model: `output_hidden_states=True` returns no per-block hidden
states, because HF records them with hooks on its own block classes, which the wrappers replace
(and they would be in a different basis and width at every block anyway).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from workers.slicing.adapters.base import FamilyAdapter


class RMSNormNoScale(nn.Module):
    """x / sqrt(sum(x^2) / D + eps): RMSNorm without a learned scale, D fixed at construction."""

    def __init__(self, full_width: int, eps: float) -> None:
        super().__init__()
        self.full_width = full_width  # D of the dense model, kept after slicing
        self.eps = eps  # the replaced norm's epsilon, so sliced-at-zero stays exact

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()  # (..., d)
        mean_square = x32.pow(2).sum(dim=-1, keepdim=True) / self.full_width  # (..., 1)
        return (x32 * torch.rsqrt(mean_square + self.eps)).to(x.dtype)

    def extra_repr(self) -> str:
        return f"full_width={self.full_width}, eps={self.eps}"


def _optional_parameter(matrix: torch.Tensor | None) -> nn.Parameter | None:
    return None if matrix is None else nn.Parameter(matrix, requires_grad=False)


def _skip(x: torch.Tensor, matrix: torch.Tensor | None) -> torch.Tensor:
    return x if matrix is None else x @ matrix


class WrappedBlock(nn.Module):
    """Holds an original decoder block and the family adapter that knows how to call its parts.

    The wrapper accepts exactly the arguments the HF decoder passes to the original block, so the
    sliced model still runs through the stock HF forward (generation and caches included).
    """

    def __init__(self, block: nn.Module, adapter: FamilyAdapter) -> None:
        super().__init__()
        self.block = block
        self.adapter = adapter  # stateless; a plain attribute, not a submodule
        self._signature = inspect.signature(block.forward)

    def call_arguments(
        self, hidden_states: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        """The block's arguments by name (positional ones included), hidden states left out."""
        bound = self._signature.bind(hidden_states, *args, **kwargs)
        named: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            parameter = self._signature.parameters[name]
            if parameter.kind is inspect.Parameter.VAR_KEYWORD:
                named.update(value)
            elif parameter.kind is not inspect.Parameter.VAR_POSITIONAL:
                named[name] = value
        first = next(iter(self._signature.parameters))
        named.pop(first)
        return named


class SkipConnectedBlock(WrappedBlock):
    """A sequential pre-norm block whose residual adds go through skip matrices.

        h = x @ S_attn + attn(norm_1(x))      # (B, T, d_in) -> (B, T, d_mid)
        y = h @ S_mlp + mlp(norm_2(h))        # (B, T, d_mid) -> (B, T, d_out)

    A missing skip matrix means the identity.
    """

    def __init__(
        self,
        block: nn.Module,
        adapter: FamilyAdapter,
        attn_skip: torch.Tensor | None = None,
        mlp_skip: torch.Tensor | None = None,
    ) -> None:
        super().__init__(block, adapter)
        self.attn_skip = _optional_parameter(attn_skip)  # (d_in, d_mid)
        self.mlp_skip = _optional_parameter(mlp_skip)  # (d_mid, d_out)

    def set_skips(self, attn_skip: torch.Tensor | None, mlp_skip: torch.Tensor | None) -> None:
        self.attn_skip = _optional_parameter(attn_skip)
        self.mlp_skip = _optional_parameter(mlp_skip)

    def attention_residual(self, x: torch.Tensor, call: dict[str, Any]) -> torch.Tensor:
        """h = x @ S_attn + attn(norm_1(x))."""
        normed = self.adapter.attn_norm(self.block)(x)  # (B, T, d_in)
        branch = self.adapter.attention_branch(self.block, normed, call)  # (B, T, d_mid)
        return _skip(x, self.attn_skip) + branch

    def mlp_residual(self, h: torch.Tensor) -> torch.Tensor:
        """y = h @ S_mlp + mlp(norm_2(h))."""
        normed = self.adapter.mlp_norm(self.block)(h)  # (B, T, d_mid)
        branch = self.adapter.mlp_branch(self.block, normed)  # (B, T, d_out)
        return _skip(h, self.mlp_skip) + branch

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        call = self.call_arguments(hidden_states, args, kwargs)
        return self.mlp_residual(self.attention_residual(hidden_states, call))


class ParallelSkipConnectedBlock(WrappedBlock):
    """A parallel-residual block (attention and MLP both read the block input) with one skip:

        y = x @ S + attn(norm_1(x)) + mlp(norm_2(x))   # (B, T, d_in) -> (B, T, d_out)

    norm_1 and norm_2 may be one module (Phi-2). A missing skip matrix means the identity.
    """

    def __init__(self, block: nn.Module, adapter: FamilyAdapter, skip: torch.Tensor | None = None) -> None:
        super().__init__(block, adapter)
        self.skip = _optional_parameter(skip)  # (d_in, d_out)

    def set_skip(self, skip: torch.Tensor | None) -> None:
        self.skip = _optional_parameter(skip)

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        call = self.call_arguments(hidden_states, args, kwargs)
        attn_norm, mlp_norm = self.adapter.attn_norm(self.block), self.adapter.mlp_norm(self.block)
        attn_in = attn_norm(hidden_states)  # (B, T, d_in)
        mlp_in = attn_in if mlp_norm is attn_norm else mlp_norm(hidden_states)
        attention = self.adapter.attention_branch(self.block, attn_in, call)  # (B, T, d_out)
        mlp = self.adapter.mlp_branch(self.block, mlp_in)  # (B, T, d_out)
        return _skip(hidden_states, self.skip) + attention + mlp


def wrap_block(block: nn.Module, adapter: FamilyAdapter) -> SkipConnectedBlock | ParallelSkipConnectedBlock:
    """The skip-connected wrapper matching the block's residual structure, skips at identity."""
    if adapter.is_parallel(block):
        return ParallelSkipConnectedBlock(block, adapter)
    return SkipConnectedBlock(block, adapter)
