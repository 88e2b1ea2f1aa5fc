"""The deviation math (docs/science.md §3) against hand computations and its own Taylor limits."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from workers.probing.deviation import (
    DistributionReference,
    kl_divergence,
    kl_estimate,
    kl_with_nll_increase,
    one_minus_cos,
    orthogonal_split,
    probability_deviations,
    vector_deviations,
)
from workers.probing.records import RecordSums

EPSILONS = (1e-1, 1e-2, 1e-3)


def _relative_errors(exact: list[torch.Tensor], estimate: list[torch.Tensor]) -> list[float]:
    """Worst relative error over rows, per epsilon."""
    return [float(((e - x).abs() / x.abs()).max()) for x, e in zip(exact, estimate, strict=True)]


def _assert_linear_convergence(errors: list[float]) -> None:
    assert errors[-1] < 0.05, errors
    for larger, smaller in itertools.pairwise(errors):
        assert 3 < larger / smaller < 30, errors  # ~10x per decade of epsilon: first order in epsilon


def test_embedding_and_logit_cosine_estimate_converges_linearly_in_epsilon() -> None:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 32, generator=generator, dtype=torch.float64)
    direction = torch.randn(64, 32, generator=generator, dtype=torch.float64)
    exact, estimate = [], []
    for eps in EPSILONS:
        one_minus_cos, *_ = vector_deviations(x, x + eps * direction * x.norm(dim=-1, keepdim=True) / 6)
        assert one_minus_cos.metric == "1-cos" and one_minus_cos.estimates is not None
        exact.append(one_minus_cos.values)
        estimate.append(one_minus_cos.estimates)
    _assert_linear_convergence(_relative_errors(exact, estimate))


@pytest.mark.parametrize("temperature", [1.0, 2.0, 0.7])
def test_probability_cosine_and_kl_estimates_converge_linearly_in_epsilon(temperature: float) -> None:
    generator = torch.Generator().manual_seed(1)
    z = 2 * torch.randn(32, 50, generator=generator, dtype=torch.float64)
    direction = torch.randn(32, 50, generator=generator, dtype=torch.float64)
    by_metric: dict[str, tuple[list[torch.Tensor], list[torch.Tensor]]] = {"1-cos": ([], []), "kl": ([], [])}
    for eps in EPSILONS:
        for deviation in probability_deviations(z, z + eps * direction, temperature):
            assert deviation.estimates is not None
            by_metric[deviation.metric][0].append(deviation.values)
            by_metric[deviation.metric][1].append(deviation.estimates)
    for exact, estimate in by_metric.values():
        _assert_linear_convergence(_relative_errors(exact, estimate))


def test_kl_is_dense_to_pruned_and_summed_over_a_five_word_vocabulary() -> None:
    p = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05], dtype=torch.float64)  # dense
    q = torch.tensor([0.02, 0.08, 0.2, 0.3, 0.4], dtype=torch.float64)  # pruned
    temperature = 1.7
    z, z2 = p.log() * temperature, q.log() * temperature  # softmax(z / T) = p
    by_hand = sum(pi * math.log(pi / qi) for pi, qi in zip(p.tolist(), q.tolist(), strict=True))
    reverse = sum(qi * math.log(qi / pi) for pi, qi in zip(p.tolist(), q.tolist(), strict=True))
    library = torch.distributions.kl_divergence(
        torch.distributions.Categorical(probs=p), torch.distributions.Categorical(probs=q)
    )
    assert abs(by_hand - reverse) > 0.1  # an asymmetric case: the direction matters
    got = float(kl_divergence(z[None], z2[None], temperature)[0])
    assert got == pytest.approx(by_hand, rel=1e-12)
    assert got == pytest.approx(float(library), rel=1e-12)
    kl = next(d for d in probability_deviations(z[None], z2[None], temperature) if d.metric == "kl")
    assert float(kl.values[0]) == pytest.approx(by_hand, rel=1e-12)
    # the estimate: Var_p(dz) / (2 T^2) with dz = z2 - z, by hand
    dz = (z2 - z).tolist()
    mean = sum(pi * d for pi, d in zip(p.tolist(), dz, strict=True))
    variance = sum(pi * (d - mean) ** 2 for pi, d in zip(p.tolist(), dz, strict=True))
    assert float(kl_estimate(z[None], z2[None], temperature)[0]) == pytest.approx(
        variance / (2 * temperature**2), rel=1e-12
    )
    assert kl.estimates is not None and float(kl.estimates[0]) == pytest.approx(
        variance / (2 * temperature**2)
    )


def test_probability_cosine_estimate_weights_by_squared_probabilities() -> None:
    p = torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64)
    dz = torch.tensor([0.01, -0.02, 0.03], dtype=torch.float64)
    z = p.log()
    r = p**2 / (p**2).sum()
    mean = (r * dz).sum()
    expected = float((r * (dz - mean) ** 2).sum() / 2)
    cosine = next(d for d in probability_deviations(z[None], (z + dz)[None]) if d.metric == "1-cos")
    assert cosine.estimates is not None and float(cosine.estimates[0]) == pytest.approx(expected, rel=1e-12)
    q = torch.softmax(z + dz, -1)
    assert float(cosine.values[0]) == pytest.approx(
        float(1 - torch.nn.functional.cosine_similarity(p, q, dim=0)), rel=1e-6
    )


def test_parallel_and_orthogonal_parts_split_the_shift() -> None:
    x = torch.tensor([[3.0, 0.0, 4.0]], dtype=torch.float64)  # ||x|| = 5
    across = torch.tensor([[4.0, 0.0, -3.0]], dtype=torch.float64)  # orthogonal to x, norm 5
    parallel, perpendicular = orthogonal_split(x, 0.3 * x + 0.4 * across)
    assert float(parallel[0]) == pytest.approx(0.3)
    assert float(perpendicular[0]) == pytest.approx(0.4)
    parallel, _ = orthogonal_split(x, -0.3 * x)
    assert float(parallel[0]) == pytest.approx(0.3)  # a norm: shrinking counts as much as growing


def test_identical_inputs_give_exactly_zero() -> None:
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(8, 16, generator=generator)
    z = 5 * torch.randn(8, 40, generator=generator)
    for deviation in [*vector_deviations(x, x.clone()), *probability_deviations(z, z.clone(), 0.5)]:
        assert torch.equal(deviation.values, torch.zeros(8, dtype=torch.float64)), deviation.metric
        if deviation.estimates is not None:
            assert torch.equal(deviation.estimates, torch.zeros(8, dtype=torch.float64))
    assert torch.equal(one_minus_cos(x, x.clone()), torch.zeros(8, dtype=torch.float64))


def test_record_means_weight_prompts_by_tokens() -> None:
    sums = RecordSums("model")
    sums.add("probs", "kl", torch.tensor([1.0]), torch.tensor([2.0]))  # a one-token prompt
    sums.add("probs", "kl", torch.tensor([0.0, 0.0, 0.0]), torch.tensor([0.0, 0.0, 0.0]))
    sums.add("tokens", "agree", torch.tensor([1.0, 0.0]), step=3)
    kl, agree = sums.records()
    assert (kl.probe, kl.space, kl.metric, kl.layer, kl.step) == ("model", "probs", "kl", None, None)
    assert kl.value == pytest.approx(0.25) and kl.estimate == pytest.approx(0.5)
    assert agree.step == 3 and agree.value == pytest.approx(0.5) and agree.estimate is None


def test_records_keep_the_spread_over_every_token_of_every_prompt() -> None:
    sums = RecordSums("counterfactual")
    sums.add("probs", "kl", torch.tensor([1.0, 2.0, 3.0]), layer=2)
    sums.add("probs", "kl", torch.tensor([[5.0]]), layer=2)  # shapes are flattened
    sums.add("probs", "kl", torch.tensor([7.0]), layer=3)  # a single token: no stderr
    two_layers = sums.records()
    point = two_layers[0]
    values = [1.0, 2.0, 3.0, 5.0]
    mean = sum(values) / 4
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / 3)
    assert point.n == 4 and point.value == pytest.approx(mean)
    assert point.stderr == pytest.approx(sd / 2) and (point.value_min, point.value_max) == (1.0, 5.0)
    assert two_layers[1].n == 1 and two_layers[1].stderr is None and two_layers[1].value_max == 7.0


def test_kl_with_nll_increase_equals_the_probe_kl_and_the_labels_cross_entropy() -> None:
    generator = torch.Generator().manual_seed(5)
    z = torch.randn(6, 40, generator=generator)
    z2 = z + 0.3 * torch.randn(6, 40, generator=generator)
    labels = torch.randint(0, 40, (6,), generator=generator)
    reference = DistributionReference.of(z, 1.5)
    alone, increase = kl_with_nll_increase(reference, z2, labels)
    full = probability_deviations(z, z2, 1.5, reference=reference)[1]
    assert alone.metric == full.metric == "kl"
    assert torch.equal(alone.values, full.values)
    assert alone.estimates is not None and full.estimates is not None
    torch.testing.assert_close(alone.estimates, full.estimates, rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(alone.estimates, kl_estimate(z, z2, 1.5).float(), rtol=1e-5, atol=1e-8)
    nll = torch.nn.functional.cross_entropy(z2 / 1.5, labels, reduction="none")
    nll0 = torch.nn.functional.cross_entropy(z / 1.5, labels, reduction="none")
    torch.testing.assert_close(increase, nll - nll0, rtol=1e-5, atol=1e-6)
    same, unchanged = kl_with_nll_increase(reference, z.clone(), labels)  # q = p: exact zeros
    assert same.estimates is not None
    assert not same.values.any() and not same.estimates.any() and unchanged.abs().max() < 1e-6
