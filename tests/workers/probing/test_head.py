"""The probes read logits through a float32 final norm and head: in float32 exactly the model's own
logits, and in bfloat16 free of the noise floor that bf16 logits put under every KL."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from transformers import PreTrainedModel

from tests.workers.probing.helpers import prompt_ids
from workers.architectures import match_structure
from workers.probing.deviation import kl_divergence
from workers.probing.endpoint import final_hidden
from workers.probing.head import VOCAB_CHUNK, Float32Head

Loader = Callable[[str], PreTrainedModel]


@pytest.mark.parametrize("family", ["llama", "gpt2", "opt", "gemma3_text"])
def test_float32_head_equals_the_models_own_logits_in_float32(load_model: Loader, family: str) -> None:
    model = load_model(family)
    adapter = match_structure(model)
    head = Float32Head(adapter, model)
    for ids in prompt_ids(count=2):
        with torch.no_grad():
            expected = model(input_ids=ids[None]).logits[0].float()  # (T, V)
        got = head(final_hidden(adapter, model, ids))
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_vocabulary_chunks_give_the_same_logits(load_model: Loader, monkeypatch: pytest.MonkeyPatch) -> None:
    model = load_model("llama").to(torch.bfloat16)  # a float32 head is read in one GEMM, unsliced
    adapter = match_structure(model)
    hidden = final_hidden(adapter, model, prompt_ids(count=1)[0])
    whole = Float32Head(adapter, model)(hidden)
    monkeypatch.setattr("workers.probing.head.VOCAB_CHUNK", 7)  # many uneven chunks
    assert VOCAB_CHUNK > 7
    torch.testing.assert_close(Float32Head(adapter, model)(hidden), whole, rtol=1e-6, atol=1e-6)


def _float64_logits(model: PreTrainedModel, hidden: torch.Tensor) -> torch.Tensor:
    """Independent reference: RMSNorm and head in float64 on the exact bf16 hidden states."""
    norm, head = model.model.norm, model.lm_head
    h = hidden.double()
    normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon) * norm.weight.double()
    return normed @ head.weight.double().T


def test_in_bfloat16_the_float32_head_removes_the_kl_noise_floor(load_model: Loader) -> None:
    dense = load_model("llama").to(torch.bfloat16)
    pruned = load_model("llama").to(torch.bfloat16)
    with torch.no_grad():  # a small change: the true KL is ~1e-5, below what bf16 logits resolve
        weight = pruned.model.layers[-1].mlp.down_proj.weight
        weight.mul_(
            1.0
            + 0.01 * torch.randn(weight.shape, generator=torch.Generator().manual_seed(0)).to(weight.dtype)
        )
    adapter = match_structure(dense)
    dense_head, pruned_head = Float32Head(adapter, dense), Float32Head(adapter, pruned)
    true, native, read = [], [], []
    for ids in prompt_ids(count=3):
        h, h2 = final_hidden(adapter, dense, ids), final_hidden(adapter, pruned, ids)  # bf16, exact
        assert h.dtype == torch.bfloat16
        true.append(kl_divergence(_float64_logits(dense, h), _float64_logits(pruned, h2), 1.0))
        with torch.no_grad():
            z = dense(input_ids=ids[None]).logits[0]  # the model's own bf16 logits
            z2 = pruned(input_ids=ids[None]).logits[0]
        native.append(kl_divergence(z.float(), z2.float(), 1.0))
        read.append(kl_divergence(dense_head(h), pruned_head(h2), 1.0))
    exact, bf16, float32 = (torch.cat(values).double().mean().item() for values in (true, native, read))
    print(f"\nKL: float64 reference {exact:.3e}, bf16 logits {bf16:.3e}, float32 head {float32:.3e}")
    assert 1e-7 < exact < 1e-3
    assert abs(float32 - exact) / exact < 1e-3  # the floor is gone
    assert abs(bf16 - exact) / exact > 0.2  # bf16 logits are far off: the floor this removes
