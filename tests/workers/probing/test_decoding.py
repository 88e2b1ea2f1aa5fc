"""Probes along the dense model's greedy generation: the counterfactual at decoding step j equals a
full forward on the prefix the dense model had written by then, and teacher forcing compares the two
models on the dense text."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from transformers import PreTrainedModel

from tests.workers.probing.helpers import prompt_ids, prune_copy
from tests.workers.probing.test_counterfactual import (
    TEMPERATURE,
    _block_output,
    _expected,
    _hybrid,
    _mid_stream,
)
from workers.probing.counterfactual import counterfactual_probe
from workers.probing.decoding import TEACHER_FORCED, decoding_counterfactual_probe, teacher_forced_probe
from workers.probing.deviation import kl_divergence
from workers.probing.generation import generate_tokens

Loader = Callable[[str], PreTrainedModel]
STEPS = 4


def test_counterfactual_at_decoding_step_j_equals_the_full_forward_on_the_prefix_written_by_then(
    load_model: Loader,
) -> None:
    dense = load_model("llama")
    pruned = prune_copy(dense, seed=5)
    prompt = prompt_ids(count=1, length=10)[0]
    records = decoding_counterfactual_probe(
        dense, pruned, [0, 1, 2], [prompt], max_new_tokens=STEPS, temperature=TEMPERATURE
    )
    points = {(r.layer, r.sublayer, r.space, r.metric, r.step): r for r in records}
    assert {r.step for r in records} == set(range(STEPS)) and all(
        r.probe == "counterfactual" for r in records
    )
    tokens = generate_tokens(dense, prompt, STEPS)
    for step in range(STEPS):
        prefix = torch.cat([prompt, torch.tensor(tokens[:step], dtype=prompt.dtype)])  # what step j reads
        for layer in range(3):
            for sublayer in ("attention", "mlp", "block"):
                hybrid = _hybrid(dense, pruned, layer, sublayer)
                if sublayer == "attention":
                    y, y2 = _mid_stream(dense, layer, prefix), _mid_stream(hybrid, layer, prefix)
                else:
                    y, y2 = _block_output(dense, layer, prefix)[1], _block_output(hybrid, layer, prefix)[1]
                expected = _expected(dense, y[-2:], y2[-2:])  # _expected drops row 0: the last position
                for (space, metric), (value, _) in expected.items():
                    got = points[(layer, sublayer, space, metric, step)]
                    assert got.value == pytest.approx(value, rel=1e-4, abs=1e-8), (
                        step,
                        layer,
                        sublayer,
                        space,
                    )
                    assert got.n == 1


def test_step_positions_must_match_the_prompts(load_model: Loader) -> None:
    dense = load_model("llama")
    with pytest.raises(ValueError, match="step positions"):
        counterfactual_probe(dense, prune_copy(dense), [0, 1, 2], prompt_ids(count=2), step_positions=[[3]])


def test_teacher_forced_steps_compare_both_models_on_the_dense_text(load_model: Loader) -> None:
    dense = load_model("llama")
    pruned = prune_copy(dense, fraction=0.3)
    prompts = prompt_ids(count=2)
    records = teacher_forced_probe(dense, pruned, prompts, max_new_tokens=STEPS, temperature=TEMPERATURE)
    points = {(r.space, r.metric, r.step): r for r in records}
    assert {r.probe for r in records} == {TEACHER_FORCED}
    assert {(space, metric) for space, metric, _ in points} == {
        ("logits", "1-cos"),
        ("probs", "1-cos"),
        ("probs", "kl"),
        ("tokens", "agree"),
    }
    for step in range(STEPS):
        kls, agrees = [], []
        for prompt in prompts:
            tokens = generate_tokens(dense, prompt, STEPS)
            prefix = torch.cat([prompt, torch.tensor(tokens[:step], dtype=prompt.dtype)])
            with torch.no_grad():
                z = dense(input_ids=prefix[None]).logits[0, -1:]
                z2 = pruned(input_ids=prefix[None]).logits[0, -1:]
            kls.append(float(kl_divergence(z, z2, TEMPERATURE)))
            agrees.append(float(int(z2.argmax()) == tokens[step]))
        assert points[("probs", "kl", step)].value == pytest.approx(sum(kls) / 2, rel=1e-4)
        assert points[("tokens", "agree", step)].value == sum(agrees) / 2
        assert points[("probs", "kl", step)].estimate is not None


def test_teacher_forcing_an_identical_model_shows_no_deviation(load_model: Loader) -> None:
    dense, same = load_model("llama"), load_model("llama")
    records = teacher_forced_probe(dense, same, prompt_ids(count=2), max_new_tokens=3)
    for record in records:
        expected = 1.0 if record.space == "tokens" else 0.0
        assert record.value == pytest.approx(expected, abs=1e-6)
