"""The head read at nested widths of one basis: a signal h and its projections on the top d
eigenvectors for several d, through the final norm and the head, with about one pass over the
vocabulary per token instead of one per width (docs/science.md, "Predicting before pruning").

The final norms of the families slicing knows are affine up to one scalar per token:

    norm(h) = a * C h / s(h) + b,    s(h) = sqrt(|C h|^2 / D + eps),

C the centring (LayerNorm) or the identity (RMSNorm, Gemma's 1 + w). With y = Q^T h the signal in
its orthonormal basis, the projection on the top d eigenvectors keeps y[:d], so

    W norm(h_d) = (G[:, :d] y[:d]) / s_d + W b,    G = W diag(a) C Q,
    |C h_d|^2 = |y[:d]|^2 - (u[:d] . y[:d])^2 / D,    u = 1^T Q.

The unnormalised logits of the widths are prefix sums: the narrowest width's are one product with
W, each wider one adds y's next coordinates times G's next columns, and the full width is h itself
(the reference). G's columns past the narrowest width cost V x D x (D - d_min) once per signal, so
this pays when a narrow model is read at many tokens and widths; `NestedWidthLogits.pays` decides
by the flop count and G's size, and the profile reads one GEMM per width otherwise.

The norm's parameters are read off the module (LayerNorm's own; otherwise its output on a zero and
a ones vector) and checked on the signal's rows before use: a norm of another form is read the
plain way, so this changes no reading beyond float32 rounding (tests/workers/profiling)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise

import torch
from torch import nn

from workers.probing.head import Float32Head

MAX_FACTOR_BYTES = 256 * 2**20  # G's columns past the narrowest width, float32 (57 MB on SmolLM2)


@dataclass(frozen=True)
class AffineNorm:
    """norm(h) = scale * C h / sqrt(|C h|^2 / D + eps) + shift; C centres when `centred`."""

    scale: torch.Tensor  # (D,) float32
    shift: torch.Tensor  # (D,) float32
    centred: bool
    eps: float

    @classmethod
    @torch.no_grad()
    def read_off(cls, norm: nn.Module, width: int, device: torch.device) -> AffineNorm | None:
        """The parameters of a float32 norm module, or None when it shows no epsilon to read."""
        ones, zeros = (torch.full((width,), v, device=device) for v in (1.0, 0.0))
        if isinstance(norm, nn.LayerNorm):
            scale = ones if norm.weight is None else norm.weight.detach().float()
            shift = zeros if norm.bias is None else norm.bias.detach().float()
            return cls(scale, shift, True, float(norm.eps))
        eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
        if not isinstance(eps, float):
            return None
        shift, at_ones = norm(torch.stack([zeros, ones]))  # |C 1|^2 / D = 1
        return cls((at_ones - shift) * math.sqrt(1.0 + eps), shift, False, eps)

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """(n, D) float32 -> (n, D), the norm by the formula."""
        centred = hidden - hidden.mean(-1, keepdim=True) if self.centred else hidden
        inverse_scale = torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + self.eps)  # 1 / s(h)
        return self.scale * centred * inverse_scale + self.shift

    @torch.no_grad()
    def matches(self, norm: nn.Module, rows: torch.Tensor) -> bool:
        """Whether the formula gives the module's output on these rows (n, D) float32."""
        expected = norm(rows)
        tolerance = 1e-5 * float(expected.abs().max()) + 1e-6
        return bool(torch.allclose(self(rows), expected, rtol=1e-4, atol=tolerance))


class NestedWidthLogits:
    """Logits of rows h and of their projections on the top d eigenvectors, for ascending `widths`
    (module docstring). `edges` are the widths read, the full width last (the rows themselves)."""

    def __init__(self, head: Float32Head, norm: AffineNorm, vectors: torch.Tensor, widths: list[int]) -> None:
        full = int(vectors.shape[0])
        self.edges = sorted(set(widths) | {full})
        self.head, self.norm, self.full = head, norm, full
        self.vectors = vectors.to(device=head.device, dtype=torch.float64)  # (D, D) Q, orthonormal
        self.basis = self.vectors.float()
        self.ones_coordinates = self.basis.sum(0)  # (D,) u = 1^T Q
        narrowest = self.edges[0]
        self.after = self._mixed(self.basis[:, narrowest:])  # (D - d_min, V) G's columns, transposed
        self.offset = head.linear(norm.shift[None], with_bias=True)[0]  # (V,) W b + bias

    @staticmethod
    def pays(tokens: int, vocab: int, full: int, widths: list[int]) -> bool:
        """Fewer flops than one head GEMM per width and the rows, and G's columns under
        MAX_FACTOR_BYTES."""
        narrowest = min(widths)
        plain = (1 + len(set(widths))) * tokens * vocab * full
        nested = tokens * vocab * full + vocab * (full + tokens) * (full - narrowest)
        return nested < plain and 4 * vocab * (full - narrowest) <= MAX_FACTOR_BYTES

    def _mixed(self, columns: torch.Tensor) -> torch.Tensor:
        """(D, k) basis columns -> (k, V): the head read on diag(a) C q for each column q."""
        if self.norm.centred:
            columns = columns - columns.mean(0, keepdim=True)
        return self.head.linear((self.norm.scale[:, None] * columns).T.contiguous(), with_bias=False)

    @torch.no_grad()
    def logits(self, rows: torch.Tensor) -> list[torch.Tensor]:
        """rows (n, D) -> per edge, ascending, the (n, V) float32 logits of its projection."""
        y = (rows.to(device=self.head.device, dtype=torch.float64) @ self.vectors).float()  # (n, D)
        narrowest = self.edges[0]
        projected = y[:, :narrowest] @ self.basis[:, :narrowest].T  # (n, D) h_{d_min}
        if self.norm.centred:
            projected = projected - projected.mean(-1, keepdim=True)
        prefix = self.head.linear(self.norm.scale * projected, with_bias=False)  # (n, V), grows in place
        logits = []
        for previous, width in pairwise([narrowest, *self.edges]):
            if width > previous:  # add the next coordinates' block of G
                prefix.addmm_(y[:, previous:width], self.after[previous - narrowest : width - narrowest])
            kept = y[:, :width]
            energy = kept.pow(2).sum(-1)  # |C h_d|^2 for RMSNorm
            if self.norm.centred:
                energy = energy - (kept @ self.ones_coordinates[:width]).pow(2) / self.full
            inverse_scale = torch.rsqrt(energy.clamp_min(0.0) / self.full + self.norm.eps)  # (n,) 1 / s_d
            logits.append(self.head.capped(torch.addcmul(self.offset, prefix, inverse_scale[:, None])))
        return logits
