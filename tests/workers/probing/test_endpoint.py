"""The whole-model probe and the multiple-choice subspace probe, against hand computations."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import pytest
import torch
from transformers import PreTrainedModel

from tests.tiny_models import build_byte_tokenizer
from tests.workers.probing.helpers import (
    prompt_ids,
    prune_copy,
    reference_metrics,
    reference_probability_metrics,
)
from workers.probing import (
    BUILTIN_PROMPTS,
    ProbePrompt,
    counterfactual_probe,
    generation_probe,
    mc_subspace_probe,
    mc_subspace_records,
    model_probe,
    option_token_ids,
)
from workers.slicing.engine import slice_model

Loader = Callable[[str], PreTrainedModel]


def test_model_probe_matches_hand_computation_on_full_forwards(load_model: Loader) -> None:
    dense = load_model("llama")
    pruned = prune_copy(dense)
    prompts = prompt_ids(count=2)
    records = model_probe(dense, pruned, prompts, temperature=0.8)
    points = {(r.space, r.metric): r for r in records}
    assert all(r.probe == "model" and r.layer is None and r.step is None for r in records)
    assert set(points) == {
        (space, metric) for space in ("embedding", "logits") for metric in ("1-cos", "dpar", "dperp", "alpha")
    } | {("probs", "1-cos"), ("probs", "kl")}
    finals: dict[str, list[torch.Tensor]] = {"dense": [], "pruned": []}
    logits: dict[str, list[torch.Tensor]] = {"dense": [], "pruned": []}
    for name, model in (("dense", dense), ("pruned", pruned)):
        last_block = model.model.layers[-1]
        handle = last_block.register_forward_hook(lambda m, a, out, n=name: finals[n].append(out[0, 1:]))
        with torch.no_grad():
            for ids in prompts:
                logits[name].append(model(input_ids=ids[None]).logits[0, 1:])
        handle.remove()
    # all tokens but each prompt's first, pooled: the token-weighted mean over prompts
    h, h2 = torch.cat(finals["dense"]), torch.cat(finals["pruned"])
    z, z2 = torch.cat(logits["dense"]), torch.cat(logits["pruned"])
    expected = {("embedding", m): v for m, v in reference_metrics(h, h2).items()}
    expected |= {("logits", m): v for m, v in reference_metrics(z, z2).items()}
    expected |= {("probs", m): v for m, v in reference_probability_metrics(z, z2, 0.8).items()}
    for point, (value, estimate) in expected.items():
        assert points[point].value == pytest.approx(value, rel=1e-6), point
        assert (points[point].estimate is None) == (estimate is None)
        if estimate is not None:
            assert points[point].estimate == pytest.approx(estimate, rel=1e-6), point
    reverse = reference_probability_metrics(z2, z, 0.8)["kl"][0]
    assert points[("probs", "kl")].value != pytest.approx(reverse, rel=1e-3)


def test_model_probe_of_identical_models_is_zero_and_narrow_models_skip_embedding(load_model: Loader) -> None:
    dense = load_model("llama")
    records = model_probe(dense, copy.deepcopy(dense), prompt_ids())
    assert records and all(r.value == 0.0 and r.estimate in (None, 0.0) for r in records)
    narrow = model_probe(dense, load_model("llama-narrow"), prompt_ids())
    assert {r.space for r in narrow} == {"logits", "probs"}


class _WordTokenizer:
    """Five words: <s>=0, A=1, B=2, C=3, the=4; one token per word, <s> first when asked."""

    words = {"A": 1, "B": 2, "C": 3, "the": 4}

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        ids = [self.words.get(word, 4) for word in text.split()]
        return {"input_ids": ([0] if add_special_tokens else []) + ids}


def test_mc_subspace_probe_on_a_hand_checkable_case() -> None:
    p = [0.05, 0.15, 0.25, 0.10, 0.45]  # dense: "the" most likely; among options B
    q = [0.05, 0.30, 0.15, 0.10, 0.40]  # pruned: "the" most likely; among options A
    prompts = [
        ProbePrompt("Question: pick one A B C Answer:", ("A", "B", "C")),
        ProbePrompt("no options here"),  # ignored
    ]
    tokenizer = _WordTokenizer()
    scored = [
        (
            torch.tensor(p).log()[None],
            torch.tensor(q).log()[None],
            {"options": option_token_ids(tokenizer, prompt.options)},
        )
        for prompt in prompts
        if prompt.options  # what mc_subspace_probe scores: the prompts with options
    ]
    records = mc_subspace_records(scored)
    points = {(r.space, r.metric): r for r in records}
    assert set(points) == {(s, m) for s in ("probs", "options") for m in ("kl", "argmax_agree")}
    assert all(r.probe == "mc-subspace" and r.layer is None and r.step is None for r in records)
    full_kl = sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True))
    po = [x / 0.5 for x in p[1:4]]  # renormalised over A, B, C
    qo = [x / 0.55 for x in q[1:4]]
    option_kl = sum(pi * math.log(pi / qi) for pi, qi in zip(po, qo, strict=True))
    dz = [math.log(qi / pi) for pi, qi in zip(po, qo, strict=True)]  # logit shift (constants cancel in Var)
    mean = sum(pi * d for pi, d in zip(po, dz, strict=True))
    option_estimate = sum(pi * (d - mean) ** 2 for pi, d in zip(po, dz, strict=True)) / 2
    assert points[("probs", "kl")].value == pytest.approx(full_kl, rel=1e-6)
    assert points[("options", "kl")].value == pytest.approx(option_kl, rel=1e-6)
    assert points[("options", "kl")].estimate == pytest.approx(option_estimate, rel=1e-6)
    assert points[("probs", "argmax_agree")].value == 1.0
    assert points[("options", "argmax_agree")].value == 0.0
    assert points[("probs", "argmax_agree")].estimate is None


def test_option_tokens_fall_back_to_the_bare_option_when_the_space_is_its_own_token() -> None:
    tokenizer = build_byte_tokenizer()  # " A" is [space, A]: the first tokens would all be the space
    assert option_token_ids(tokenizer, ("A", "B", "C", "D")) == [ord("A"), ord("B"), ord("C"), ord("D")]
    with pytest.raises(ValueError, match="distinct"):
        option_token_ids(tokenizer, ("Apple", "Avocado"))


def test_mc_subspace_probe_runs_on_the_builtin_prompts(load_model: Loader) -> None:
    dense = load_model("llama")
    records = mc_subspace_probe(dense, prune_copy(dense), build_byte_tokenizer(), list(BUILTIN_PROMPTS))
    assert {(r.space, r.metric) for r in records} == {
        (s, m) for s in ("probs", "options") for m in ("kl", "argmax_agree")
    }
    assert all(r.value >= 0 for r in records)


def test_builtin_prompts_are_four_choice_four_arithmetic_four_open() -> None:
    choice = [p for p in BUILTIN_PROMPTS if p.options]
    assert len(BUILTIN_PROMPTS) == 12 and len(choice) == 4
    assert all(p.options == ("A", "B", "C", "D") and p.text.endswith("Answer:") for p in choice)
    assert sum("=" in p.text for p in BUILTIN_PROMPTS) == 4


def test_sliced_model_skips_the_counterfactual_and_every_embedding_space(load_model: Loader) -> None:
    dense = load_model("llama")
    sliced = copy.deepcopy(dense)
    slice_model(sliced, torch.stack(prompt_ids(count=4, length=16, seed=1)[:1] * 4), None, 0.25)
    with pytest.raises(ValueError, match="per-layer counterfactual needs equal hidden widths"):
        counterfactual_probe(dense, sliced, [0, 1, 2], prompt_ids())
    records = model_probe(dense, sliced, prompt_ids()) + generation_probe(
        dense, sliced, [0, 1, 2], prompt_ids(), max_new_tokens=2
    )
    assert records and {r.space for r in records} == {"logits", "probs", "tokens"}
