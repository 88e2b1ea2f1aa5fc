"""The probe conventions (core.probe_conventions): each rule where `released-code` departs from
`prunecast` is checked against a hand computation, so that swapping any one of them fails a test."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch
from transformers import PreTrainedModel

from core.probe_conventions import PRUNECAST, RELEASED_CODE, ProbeConvention
from tests.workers.probing.helpers import prompt_ids, prune_copy
from workers.context import JobFailure
from workers.kinds.probe import check_options
from workers.probing import ProbePrompt, counterfactual_probe, model_probe
from workers.probing.deviation import probability_deviations, vector_deviations

Loader = Callable[[str], PreTrainedModel]
T = 0.7


def _peaked_norm(model: PreTrainedModel) -> PreTrainedModel:
    """A final norm whose weights differ per coordinate: reading with and without it differs."""
    with torch.no_grad():
        generator = torch.Generator().manual_seed(5)
        model.model.norm.weight.copy_(
            0.2 + 3 * torch.rand(model.model.norm.weight.shape, generator=generator)
        )
    return model


def _block0_outputs(
    dense: PreTrainedModel, pruned: PreTrainedModel, ids: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """Block 0's output in both models at every position but the first: the pruned block on the
    dense input, since both read the same (unpruned) embeddings."""
    with torch.no_grad():
        y = dense(input_ids=ids[None], output_hidden_states=True).hidden_states[1][0, 1:]
        y2 = pruned(input_ids=ids[None], output_hidden_states=True).hidden_states[1][0, 1:]
    return y.double(), y2.double()


def _kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax(a / T) || softmax(b / T)) per row, written out."""
    log_p, log_q = torch.log_softmax(p_logits / T, -1), torch.log_softmax(q_logits / T, -1)
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def _variance(weights_logits: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Var under softmax(weights_logits / T) of the logit shift, over (2 T^2)."""
    w = torch.softmax(weights_logits / T, -1)
    mean = (w * shift).sum(-1, keepdim=True)
    return (w * (shift - mean) ** 2).sum(-1) / (2 * T**2)


def _block0(records: list, space: str, metric: str) -> tuple[float, float | None]:
    [point] = [r for r in records if (r.layer, r.sublayer, r.space, r.metric) == (0, "block", space, metric)]
    return point.value, point.estimate


def _probe(
    dense: PreTrainedModel, pruned: PreTrainedModel, ids: torch.Tensor, convention: ProbeConvention
) -> list:
    return counterfactual_probe(
        dense, pruned, [0, 1, 2], [ids], temperature=T, sublayers=("block",), convention=convention
    )


def test_released_code_reads_layers_through_the_bare_head_with_kl_from_the_pruned_side(
    load_model: Loader,
) -> None:
    dense = _peaked_norm(load_model("llama"))
    pruned = prune_copy(dense)
    [ids] = prompt_ids(count=1, length=12)
    y, y2 = _block0_outputs(dense, pruned, ids)
    head = dense.lm_head.weight.detach().double()
    bare, bare2 = y @ head.T, y2 @ head.T  # lm_head(h): no final norm
    norm = dense.model.norm
    with torch.no_grad():
        normed, normed2 = norm(y.float()).double() @ head.T, norm(y2.float()).double() @ head.T

    released = _probe(dense, pruned, ids, RELEASED_CODE)
    cos = 1 - torch.nn.functional.cosine_similarity(bare, bare2, dim=-1)
    assert _block0(released, "logits", "1-cos")[0] == pytest.approx(float(cos.mean()), rel=1e-4)
    kl_value, kl_estimate = _block0(released, "probs", "kl")
    assert kl_value == pytest.approx(float(_kl(bare2, bare).mean()), rel=1e-4)  # KL(pruned || dense)
    assert kl_estimate == pytest.approx(float(_variance(bare2, bare2 - bare).mean()), rel=1e-4)  # Var_q

    prunecast = _probe(dense, pruned, ids, PRUNECAST)
    normed_cos = 1 - torch.nn.functional.cosine_similarity(normed, normed2, dim=-1)
    assert _block0(prunecast, "logits", "1-cos")[0] == pytest.approx(float(normed_cos.mean()), rel=1e-4)
    kl_value, kl_estimate = _block0(prunecast, "probs", "kl")
    assert kl_value == pytest.approx(float(_kl(normed, normed2).mean()), rel=1e-4)  # KL(dense || pruned)
    assert kl_estimate == pytest.approx(float(_variance(normed, normed2 - normed).mean()), rel=1e-4)

    # each rule moves the number well beyond the tolerances above, so a swapped rule fails
    assert abs(float(cos.mean()) / float(normed_cos.mean()) - 1) > 0.01
    assert abs(float(_kl(bare2, bare).mean()) / float(_kl(bare, bare2).mean()) - 1) > 0.01
    swapped_weights = float(_variance(bare, bare2 - bare).mean())
    assert abs(float(_variance(bare2, bare2 - bare).mean()) / swapped_weights - 1) > 0.01


def test_the_output_keeps_kl_from_the_dense_side_under_released_code(load_model: Loader) -> None:
    dense = _peaked_norm(load_model("llama"))
    pruned = prune_copy(dense)
    [ids] = prompt_ids(count=1, length=12)
    with torch.no_grad():
        z = dense(input_ids=ids[None]).logits[0, 1:].double()
        z2 = pruned(input_ids=ids[None]).logits[0, 1:].double()
    records = model_probe(dense, pruned, [ids], temperature=T, convention=RELEASED_CODE)
    [kl] = [r for r in records if (r.space, r.metric) == ("probs", "kl")]
    assert kl.value == pytest.approx(float(_kl(z, z2).mean()), rel=1e-4)
    assert kl.estimate == pytest.approx(float(_variance(z, z2 - z).mean()), rel=1e-4)
    assert abs(float(_kl(z2, z).mean()) / kl.value - 1) > 0.01  # the other direction would fail


def test_the_decomposition_adds_back_to_the_deviation() -> None:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(6, 16, generator=generator, dtype=torch.float64)
    dx = torch.randn(6, 16, generator=generator, dtype=torch.float64)
    metrics = {d.metric: d.values for d in vector_deviations(x, x + dx)}
    norm = x.norm(dim=-1)
    # dx = alpha x + dx_perp, dx_perp orthogonal to x: the squared norms add up
    assert torch.allclose((metrics["alpha"] ** 2 + metrics["dperp"] ** 2) * norm**2, dx.norm(dim=-1) ** 2)
    assert torch.allclose(metrics["dpar"], metrics["alpha"].abs())
    alpha = (dx * x).sum(-1) / norm**2
    perp = dx - alpha[:, None] * x
    assert torch.allclose(metrics["alpha"], alpha)
    assert torch.allclose(metrics["dperp"], perp.norm(dim=-1) / norm)
    shrunk = {d.metric: d.values for d in vector_deviations(x, 0.5 * x)}
    assert torch.allclose(shrunk["alpha"], torch.full((6,), -0.5, dtype=torch.float64))  # signed
    assert torch.allclose(shrunk["dperp"], torch.zeros(6, dtype=torch.float64), atol=1e-12)


def test_temperature_scales_the_estimates_as_one_over_t_squared() -> None:
    """With a uniform reference distribution (constant logits) the weights do not move with T, so
    both estimates are exactly Var(dz) / (2 T^2); the reference is the first argument in either
    convention (released-code passes the pruned logits first per sublayer)."""
    flat = torch.zeros(3, 50, dtype=torch.float64)
    shifted = torch.randn(3, 50, generator=torch.Generator().manual_seed(1), dtype=torch.float64)

    def estimates(temperature: float) -> dict[str, torch.Tensor]:
        deviations = probability_deviations(flat, shifted, temperature)
        return {d.metric: d.estimates for d in deviations if d.estimates is not None}

    at_one, at_half = estimates(1.0), estimates(0.5)
    for metric in ("kl", "1-cos"):
        assert torch.allclose(at_half[metric], 4 * at_one[metric])
    assert torch.allclose(at_one["kl"], shifted.var(dim=-1, unbiased=False) / 2)


def test_option_letters_that_share_a_token_fail_a_released_code_job_before_pruning() -> None:
    class OneToken:  # every text encodes to the same single token
        def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
            return {"input_ids": [7]} if text.startswith(" ") else {"input_ids": [ord(text[0])]}

    dense = SimpleNamespace(tokenizer=OneToken())
    prompts = [ProbePrompt("Q? A. x B. y\nAnswer:", ("A", "B"))]
    check_options(dense, prompts, PRUNECAST)  # the prompt's own options fall back to "A", "B"
    with pytest.raises(JobFailure, match=r"option letters .* do not end in distinct tokens"):
        check_options(dense, prompts, RELEASED_CODE)
    check_options(dense, [ProbePrompt("no options")], RELEASED_CODE)  # no subspace, nothing to check
