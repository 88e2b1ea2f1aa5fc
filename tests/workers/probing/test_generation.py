"""Generation divergence: each model on its own trajectory, greedy like HF generate, sampled with
shared seeded randomness."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
import torch
from transformers import PreTrainedModel

from tests.workers.probing.helpers import prompt_ids, prune_copy
from workers.probing import ProbeRecord, ProbeStopped, generate_tokens, generation_probe
from workers.probing.deviation import kl_divergence
from workers.probing.generation import choose_token, sampling_uniforms

Loader = Callable[[str], PreTrainedModel]
STEPS = 6


def _select(
    records: list[ProbeRecord], probe: str, space: str, metric: str, layer: int | None = None
) -> list[float]:
    """Values of one probe point, by step."""
    chosen = sorted(
        (r for r in records if (r.probe, r.space, r.metric, r.layer) == (probe, space, metric, layer)),
        key=lambda r: r.step or 0,
    )
    assert [r.step for r in chosen] == list(range(STEPS))
    return [r.value for r in chosen]


def test_greedy_tokens_equal_hf_generate(load_model: Loader) -> None:
    model = load_model("llama")
    model.generation_config.eos_token_id = None  # run all steps, as the probe does
    for ids in prompt_ids(count=2):
        expected = model.generate(ids[None], do_sample=False, max_new_tokens=10, pad_token_id=0)[
            0, ids.numel() :
        ]
        assert generate_tokens(model, ids, 10) == expected.tolist()


def test_inverse_cdf_sampling_picks_the_token_whose_interval_holds_the_uniform() -> None:
    logits = torch.tensor([0.1, 0.2, 0.7]).log()
    assert [choose_token(logits, u, 1.0) for u in (0.05, 0.25, 0.31, 0.999)] == [0, 1, 2, 2]
    assert choose_token(logits, None, 1.0) == 2
    # temperature 2 flattens: p ~ sqrt([0.1, 0.2, 0.7]) = [0.19, 0.27, 0.54] (normalised)
    assert choose_token(logits, 0.3, 2.0) == 1


def test_sampled_tokens_are_reproducible_with_the_seed(load_model: Loader) -> None:
    model = load_model("llama")
    ids = prompt_ids(count=1)[0]
    first = generate_tokens(model, ids, 12, uniforms=sampling_uniforms(7, 1, 12)[0])
    again = generate_tokens(model, ids, 12, uniforms=sampling_uniforms(7, 1, 12)[0])
    other = generate_tokens(model, ids, 12, uniforms=sampling_uniforms(8, 1, 12)[0])
    assert first == again and first != other
    assert torch.equal(sampling_uniforms(7, 3, 5)[0], sampling_uniforms(7, 1, 5)[0])


def test_identical_models_agree_at_every_step_with_zero_deviation(load_model: Loader) -> None:
    # a second load, not copy.deepcopy: a deep copy can place weights at another memory alignment,
    # and single-token (cached) matmuls then round differently (~1e-7 relative in fp32)
    dense, same = load_model("llama"), load_model("llama")
    records = generation_probe(dense, same, [0, 1, 2], prompt_ids(), max_new_tokens=STEPS)
    assert {r.probe for r in records} == {"generation-greedy", "generation-sampled"}
    for record in records:
        if record.space == "tokens":
            assert record.value == 1.0
        else:
            assert record.value == 0.0 and record.estimate in (None, 0.0)


def test_generation_records_each_step_and_kl_is_dense_to_pruned(load_model: Loader) -> None:
    dense = load_model("llama")
    pruned = prune_copy(dense, fraction=0.3)
    prompts = prompt_ids(count=3)
    records = generation_probe(
        dense, pruned, [0, 1, 2], prompts, max_new_tokens=STEPS, temperature=1.3, seed=4
    )
    for probe in ("generation-greedy", "generation-sampled"):
        agree = _select(records, probe, "tokens", "agree")
        prefix = _select(records, probe, "tokens", "prefix_agree")
        assert all(later <= earlier for earlier, later in itertools.pairwise(prefix))
        assert all(p <= a for p, a in zip(prefix, agree, strict=True))
        for space in ("embedding", "logits", "probs"):
            assert all(v > 0 for v in _select(records, probe, space, "1-cos"))
        for layer in range(3):
            assert all(v > 0 for v in _select(records, probe, "embedding", "1-cos", layer=layer))
        kl = _select(records, probe, "probs", "kl")
        # step 0 compares the next-token distributions after the shared prompt: KL(dense || pruned)
        with torch.no_grad():
            z = torch.stack([dense(input_ids=ids[None]).logits[0, -1] for ids in prompts])
            z2 = torch.stack([pruned(input_ids=ids[None]).logits[0, -1] for ids in prompts])
        assert kl[0] == pytest.approx(float(kl_divergence(z, z2, 1.3).mean()), rel=1e-6)
        assert kl[0] != pytest.approx(float(kl_divergence(z2, z, 1.3).mean()), rel=1e-3)
        assert all(
            r.estimate is not None for r in records if r.probe == probe and r.metric in ("kl", "1-cos")
        )
    again = generation_probe(dense, pruned, [0, 1, 2], prompts, max_new_tokens=STEPS, temperature=1.3, seed=4)
    assert again == records


def test_narrower_pruned_stream_skips_only_the_embedding_space(load_model: Loader) -> None:
    records = generation_probe(
        load_model("llama"), load_model("llama-narrow"), [0, 1, 2], prompt_ids(), max_new_tokens=3
    )
    assert records and not [r for r in records if r.space == "embedding"]
    assert {r.space for r in records} == {"logits", "probs", "tokens"}


def test_progress_per_step_and_stop(load_model: Loader) -> None:
    dense = load_model("llama")
    pruned = prune_copy(dense)
    seen: list[tuple[int, int]] = []
    generation_probe(
        dense,
        pruned,
        [0, 1, 2],
        prompt_ids(count=2),
        max_new_tokens=3,
        progress=lambda d, t: seen.append((d, t)),
    )
    assert seen == [(done, 12) for done in range(1, 13)]
    with pytest.raises(ProbeStopped):
        generation_probe(
            dense, pruned, [0, 1, 2], prompt_ids(count=2), max_new_tokens=3, should_stop=lambda: True
        )
