"""Deviation between a dense and a pruned representation, token by token (docs/science.md §3).

Every function takes the dense tensor first and the pruned one second, rows = tokens, and
returns one value per row, computed in float32 (model activations in bf16/fp16 are upcast) or in
float64 where the caller passes float64. On SmolLM2-135M (magnitude 50%, every layer, sublayer,
space and metric of a counterfactual) float32 and float64 agreed to 2.6e-6 relative at worst, while
the float64 passes over the 49k vocabulary were most of the probe's time; the means over tokens are
accumulated in float64 (`RecordSums`). Three spaces:

- embedding h (a hidden state after a block) and logits z = lm_head(final_norm(h)): vectors
  compared by angle, "1-cos" = 1 - cos(x, x + dx), with the Taylor estimate
  ||dx_perp||^2 / (2 ||x||^2); and the split of dx into the part along x and the part orthogonal
  to it, dx = alpha x + dx_perp: "alpha" (signed: below 0 the pruned vector shrinks along x),
  "dpar" = ||dx_par|| / ||x|| = |alpha| and "dperp" = ||dx_perp|| / ||x||, as the authors' code
  reports them beside the cosine.
- probabilities p = softmax(z / T) (dense) and q = softmax(z' / T) (pruned): "1-cos" with the
  estimate Var_r(dz) / (2 T^2), r_i = p_i^2 / sum_j p_j^2; and "kl" = KL(p || q)
  = sum_i p_i (log p_i - log q_i), dense first, SUMMED over the vocabulary, in nats, with the
  estimate Var_p(dz) / (2 T^2). Every probe measures KL through `kl_divergence`, so the direction
  is the same everywhere.

Forms are chosen so that identical inputs give exactly zero: 1 - cos is computed as
||x/|x| - x'/|x'|||^2 / 2 (no cancellation of 1 - dot), variances as sums of squared deviations.

Speed: a counterfactual compares one dense reading of a layer with up to three pruned ones over a
vocabulary of ~50k, so the dense side (working copy, norms, unit vectors, p, log p, r) is prepared
once as a `VectorReference` / `DistributionReference` and shared; KL(p || q) is computed from p and
e = dz / T as logsumexp(log p + e) - logsumexp(log p) - E_p[e] (the same quantity as
sum_i p_i (log p_i - log q_i), without materialising log q), which halves the passes over the vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch


def _safe(norm: torch.Tensor) -> torch.Tensor:
    """`norm` with zeros (all-zero rows) raised to the dtype's smallest normal number."""
    return norm.clamp_min(torch.finfo(norm.dtype).tiny)


@dataclass(frozen=True)
class TokenDeviation:
    """One metric for a set of tokens."""

    metric: str  # "1-cos" | "dpar" | "dperp" | "alpha" | "kl"
    values: torch.Tensor  # (N,) the exact value per token
    estimates: torch.Tensor | None  # (N,) Taylor estimate per token, where one exists


def one_minus_cos(x: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """1 - cos(x, x2) per row, as ||x/|x| - x2/|x2|||^2 / 2 (exact 0 when x2 == x)."""
    x, x2 = x.double(), x2.double()  # (N, D)
    unit = x / _safe(x.norm(dim=-1, keepdim=True))
    unit2 = x2 / _safe(x2.norm(dim=-1, keepdim=True))
    return 0.5 * (unit - unit2).pow(2).sum(dim=-1)  # (N,)


def orthogonal_split(x: torch.Tensor, dx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(||dx_par|| / ||x||, ||dx_perp|| / ||x||) per row, dx_par the projection of dx on x."""
    x, dx = x.double(), dx.double()  # (N, D)
    square = _safe(x.pow(2).sum(dim=-1, keepdim=True))  # (N, 1)
    along = (dx * x).sum(dim=-1, keepdim=True) / square  # (N, 1): dx_par = along * x
    norm = square.sqrt().squeeze(-1)  # (N,)
    parallel = along.squeeze(-1).abs()  # ||along * x|| / ||x|| = |along|
    perpendicular = (dx - along * x).norm(dim=-1) / norm
    return parallel, perpendicular


def weighted_variance(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Var_w(values) per row, weights normalised to sum to one: sum_i w_i (v_i - E_w v)^2."""
    values, weights = values.double(), weights.double()  # (N, V)
    weights = weights / _safe(weights.sum(dim=-1, keepdim=True))
    return _variance(values, weights)


def working(x: torch.Tensor) -> torch.Tensor:
    """x in the precision the deviations are computed in: float32 at least (model activations in
    bf16/fp16 are upcast), float64 kept where the caller passes it."""
    return x if x.dtype == torch.float64 else x.float()


def _variance(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Var_w(values) per row for weights that already sum to one."""
    mean = (weights * values).sum(dim=-1, keepdim=True)  # (N, 1)
    return (weights * (values - mean).pow(2)).sum(dim=-1)  # (N,)


@dataclass(frozen=True)
class VectorReference:
    """Dense vectors (hidden states or logits) prepared once for comparison with pruned ones."""

    x: torch.Tensor  # (N, D) in the working precision
    norm: torch.Tensor  # (N, 1) ||x||
    unit: torch.Tensor  # (N, D) x / ||x||

    @classmethod
    def of(cls, x: torch.Tensor) -> VectorReference:
        x = working(x)
        norm = _safe(x.norm(dim=-1, keepdim=True))
        return cls(x, norm, x / norm)


@dataclass(frozen=True)
class DistributionReference:
    """The dense distribution p = softmax(z / T), prepared once for comparison with pruned ones.
    The 1 - cos weights (`p_unit`, `r`) are prepared on first use: KL alone never pays for them."""

    z: torch.Tensor  # (N, V) logits in the working precision
    temperature: float
    log_p: torch.Tensor  # (N, V)
    log_total: torch.Tensor  # (N,) logsumexp(log_p): 0 up to rounding, kept so that q = p gives KL 0
    p: torch.Tensor  # (N, V)

    @classmethod
    def of(cls, z: torch.Tensor, temperature: float = 1.0) -> DistributionReference:
        z = working(z)
        log_p = torch.log_softmax(z if temperature == 1.0 else z / temperature, dim=-1)  # z / 1 is z
        log_total = torch.logsumexp(log_p, dim=-1)
        # The same operations `probability_deviations` applies to q, so that q = p gives exact zeros.
        p = (log_p - log_total[:, None]).exp()
        return cls(z, temperature, log_p, log_total, p)

    @cached_property
    def p_unit(self) -> torch.Tensor:
        """(N, V) p / ||p||."""
        return self.p / _safe(self.p.norm(dim=-1, keepdim=True))

    @cached_property
    def r(self) -> torch.Tensor:
        """(N, V) p^2 / sum p^2: the weights of the 1 - cos(p, q) estimate."""
        square = self.p.pow(2)
        return square / square.sum(dim=-1, keepdim=True)


def _kl(reference: DistributionReference, scaled_shift: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(KL(p || q), log q) per row for q = softmax((z + dz) / T), given e = dz / T."""
    shifted = reference.log_p + scaled_shift  # (N, V): log p + e = log q + log normaliser
    normaliser = torch.logsumexp(shifted, dim=-1)  # (N,)
    mean_shift = (reference.p * scaled_shift).sum(dim=-1)  # E_p[e]
    kl = (normaliser - reference.log_total) - mean_shift
    return kl.clamp_min(0.0), shifted - normaliser[:, None]


def kl_divergence(z: torch.Tensor, z2: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """KL(p || q) per row in nats, p = softmax(z / T) dense, q = softmax(z2 / T) pruned, summed
    over the vocabulary. The one KL every probe uses (through `_kl`)."""
    reference = DistributionReference.of(z, temperature)
    return _kl(reference, (z2.to(reference.z.dtype) - reference.z) / temperature)[0]


def kl_estimate(z: torch.Tensor, z2: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Second-order estimate of KL(p || q): Var_p(dz) / (2 T^2), dz = z2 - z."""
    p = torch.softmax(z.double() / temperature, dim=-1)  # (N, V)
    return weighted_variance(z2.double() - z.double(), p) / (2 * temperature**2)


def vector_deviations(
    x: torch.Tensor, x2: torch.Tensor, reference: VectorReference | None = None
) -> list[TokenDeviation]:
    """ "1-cos" (with its estimate), "dpar", "dperp" and "alpha" for hidden states or logits, per row.
    `reference` (VectorReference.of(x)) saves preparing x again when it is compared several times."""
    dense = VectorReference.of(x) if reference is None else reference
    x2 = x2.to(dense.x.dtype)  # (N, D)
    dx = x2 - dense.x
    along = (dx * dense.unit).sum(dim=-1, keepdim=True)  # (N, 1): dx_par = along * unit
    alpha = along.squeeze(-1) / dense.norm.squeeze(-1)  # dx_par = alpha * x
    parallel = alpha.abs()
    perpendicular = (dx - along * dense.unit).norm(dim=-1) / dense.norm.squeeze(-1)
    unit2 = x2 / _safe(x2.norm(dim=-1, keepdim=True))
    one_minus_cosine = 0.5 * (dense.unit - unit2).pow(2).sum(dim=-1)
    return [
        TokenDeviation("1-cos", one_minus_cosine, perpendicular.pow(2) / 2),
        TokenDeviation("dpar", parallel, None),
        TokenDeviation("dperp", perpendicular, None),
        TokenDeviation("alpha", alpha, None),
    ]


def kl_with_nll_increase(
    reference: DistributionReference, z2: torch.Tensor, labels: torch.Tensor
) -> tuple[TokenDeviation, torch.Tensor]:
    """ "kl" with its estimate Var_p(dz) / (2 T^2), and the increase of the labels' NLL,
    -log q_y + log p_y = logsumexp(log p + e) - log_total - e_y: what a lens reading needs (no q,
    no 1 - cos). The product p e serves both E_p[e] and the variance, sum_i p_i e_i (e_i - E_p[e]),
    so a pruned row costs about five passes over the vocabulary. labels (N,) int64."""
    shift = z2.to(reference.z.dtype) - reference.z  # (N, V): e = dz / T
    if reference.temperature != 1.0:  # dividing by 1 would be a pass over the vocabulary for nothing
        shift /= reference.temperature
    normaliser = torch.logsumexp(reference.log_p + shift, dim=-1) - reference.log_total  # (N,)
    weighted = reference.p * shift  # (N, V)
    mean_shift = weighted.sum(dim=-1)  # E_p[e], as `_kl` sums it
    label_shift = shift.gather(1, labels[:, None]).squeeze(1)  # (N,) e_y
    variance = weighted.mul_(shift.sub_(mean_shift[:, None])).sum(dim=-1)  # (N,)
    kl = (normaliser - mean_shift).clamp_min(0.0)
    return TokenDeviation("kl", kl, variance / 2), normaliser - label_shift


def probability_deviations(
    z: torch.Tensor,
    z2: torch.Tensor,
    temperature: float = 1.0,
    reference: DistributionReference | None = None,
) -> list[TokenDeviation]:
    """ "1-cos" and "kl" (each with its estimate) between p = softmax(z / T) and q = softmax(z2 / T).
    `reference` (DistributionReference.of(z, T)) saves preparing p again."""
    dense = DistributionReference.of(z, temperature) if reference is None else reference
    if dense.temperature != temperature:
        raise ValueError(f"reference prepared at T={dense.temperature}, asked for T={temperature}")
    shift = (z2.to(dense.z.dtype) - dense.z) / temperature  # (N, V): e = dz / T
    kl, log_q = _kl(dense, shift)
    q = log_q.exp()
    q_unit = q / _safe(q.norm(dim=-1, keepdim=True))
    one_minus_cosine = 0.5 * (dense.p_unit - q_unit).pow(2).sum(dim=-1)
    # Var(dz) / (2 T^2) = Var(e) / 2
    return [
        TokenDeviation("1-cos", one_minus_cosine, _variance(shift, dense.r) / 2),
        TokenDeviation("kl", kl, _variance(shift, dense.p) / 2),
    ]
