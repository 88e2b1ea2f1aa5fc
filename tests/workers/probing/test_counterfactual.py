"""The per-layer counterfactual equals a full forward of a hybrid model, at the cost of one block
forward per layer and sublayer."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from transformers import PreTrainedModel

from tests.workers.probing.helpers import (
    prompt_ids,
    prune_copy,
    reference_metrics,
    reference_probability_metrics,
)
from workers.architectures import match_structure
from workers.probing import ProbeRecord, ProbeStopped, common, counterfactual_probe
from workers.slicing.portable.sliced_modules import get_path, set_path

TEMPERATURE = 1.5
Loader = Callable[[str], PreTrainedModel]


def _by_point(records: list[ProbeRecord]) -> dict[tuple[Any, ...], ProbeRecord]:
    points = {(r.layer, r.sublayer, r.space, r.metric): r for r in records}
    assert len(points) == len(records), "one record per point"
    return points


@torch.no_grad()
def _block_output(model: nn.Module, layer: int, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(input, output) of block `layer` in a full forward, via hooks (HF's last hidden_states entry
    is after the final norm for some families)."""
    found: dict[str, torch.Tensor] = {}
    block = match_structure(model).blocks(model)[layer]

    def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        found["in"] = args[0]
        found["out"] = output[0] if isinstance(output, tuple) else output

    handle = block.register_forward_hook(hook)
    try:
        model(input_ids=ids[None], use_cache=False)
    finally:
        handle.remove()
    return found["in"][0], found["out"][0]  # (T, D) each


def _mid_stream(model: nn.Module, layer: int, ids: torch.Tensor) -> torch.Tensor:
    """(T, D): block `layer`'s attention sublayer output x + attn(norm(x)) in a full forward, read as
    the input of the block's MLP norm."""
    found: dict[str, torch.Tensor] = {}
    adapter = match_structure(model)
    block = adapter.blocks(model)[layer]
    norm = getattr(block, "pre_feedforward_layernorm", None) or adapter.mlp_norm(block)  # Gemma: post-norms

    def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
        found["mid"] = args[0]

    handle = norm.register_forward_pre_hook(hook)
    try:
        model(input_ids=ids[None], use_cache=False)
    finally:
        handle.remove()
    mid = found["mid"]
    return mid.reshape(-1, mid.shape[-1])  # (T, D): OPT flattens (1, T, D) before this norm


def _hybrid(dense: nn.Module, pruned: nn.Module, layer: int, sublayer: str) -> nn.Module:
    """The dense model with only one sublayer of block `layer` taken from the pruned model."""
    hybrid = copy.deepcopy(dense)
    adapter = match_structure(hybrid)
    dense_block, pruned_block = adapter.blocks(hybrid)[layer], adapter.blocks(pruned)[layer]
    if sublayer == "block":
        adapter.blocks(hybrid)[layer] = copy.deepcopy(pruned_block)
        return hybrid
    paths = {
        "attention": adapter.attn_reader_paths + adapter.attn_writer_paths,
        "mlp": adapter.mlp_reader_paths + adapter.mlp_writer_paths,
    }[sublayer]
    for path in paths:
        set_path(dense_block, path, copy.deepcopy(get_path(pruned_block, path)))
    return hybrid


@torch.no_grad()
def _expected(
    dense: nn.Module, y: torch.Tensor, y2: torch.Tensor
) -> dict[tuple[str, str], tuple[float, Any]]:
    """Reference metrics for one layer from full-forward tensors, first position left out."""
    adapter = match_structure(dense)
    y, y2 = y[1:], y2[1:]
    z = adapter.lm_head(dense)(adapter.final_norm(dense)(y))
    z2 = adapter.lm_head(dense)(adapter.final_norm(dense)(y2))
    expected = {("embedding", m): v for m, v in reference_metrics(y, y2).items()}
    expected |= {("logits", m): v for m, v in reference_metrics(z, z2).items()}
    expected |= {("probs", m): v for m, v in reference_probability_metrics(z, z2, TEMPERATURE).items()}
    return expected


@pytest.mark.parametrize("family", ["llama", "gpt2", "opt", "gemma3_text"])
def test_counterfactual_equals_full_forward_with_only_that_sublayer_pruned(
    family: str, load_model: Loader
) -> None:
    dense = load_model(family)
    pruned = prune_copy(dense, seed=5)
    ids = prompt_ids(count=1, length=12)[0]
    layers = len(match_structure(dense).blocks(dense))
    records = counterfactual_probe(dense, pruned, list(range(layers)), [ids], temperature=TEMPERATURE)
    points = _by_point(records)
    assert {(r.layer, r.sublayer) for r in records} == {
        (layer, sublayer) for layer in range(layers) for sublayer in ("attention", "mlp", "block")
    }
    for layer in range(layers):
        _, y = _block_output(dense, layer, ids)
        for sublayer in ("attention", "mlp", "block"):
            hybrid = _hybrid(dense, pruned, layer, sublayer)
            if sublayer == "attention":  # measured at the attention sublayer's output (the research's)
                expected = _expected(dense, _mid_stream(dense, layer, ids), _mid_stream(hybrid, layer, ids))
            else:
                expected = _expected(dense, y, _block_output(hybrid, layer, ids)[1])
            assert len(expected) == 10  # (embedding, logits) x 4 metrics + probs 1-cos and kl
            for (space, metric), (value, estimate) in expected.items():
                record = points[(layer, sublayer, space, metric)]
                # The probe computes in float32 (the activations' precision): 1e-5 is its rounding.
                assert record.value == pytest.approx(value, rel=1e-5, abs=1e-9), (
                    layer,
                    sublayer,
                    space,
                    metric,
                )
                assert abs(value) > 1e-7  # the pruning really moved this point (alpha is signed)
                if estimate is None:
                    assert record.estimate is None
                else:
                    assert record.estimate == pytest.approx(estimate, rel=1e-5, abs=1e-9)


def test_identical_pruned_model_gives_exactly_zero_and_skips_unchanged_branches(load_model: Loader) -> None:
    dense = load_model("llama")
    records = counterfactual_probe(dense, copy.deepcopy(dense), [0, 1, 2], prompt_ids())
    assert records and {r.sublayer for r in records} == {"block"}  # attention, mlp: identical linears
    assert all(r.value == 0.0 and r.estimate in (None, 0.0) for r in records)


def test_only_changed_branches_are_recorded(load_model: Loader) -> None:
    dense = load_model("llama")
    pruned = prune_copy(dense, branches=("attention",))
    records = counterfactual_probe(dense, pruned, [0, 1, 2], prompt_ids(count=1))
    assert {r.sublayer for r in records} == {"attention", "block"}
    points = _by_point(records)
    for layer in range(3):
        # The MLP is the dense one, so the block's shift is the attention's plus the MLP's reaction to
        # it; the attention's own is measured before the MLP (its sublayer output), so they differ.
        block, attention = (
            points[(layer, "block", "embedding", "1-cos")],
            points[(layer, "attention", "embedding", "1-cos")],
        )
        assert block.value > 0 and attention.value > 0
        assert block.value != pytest.approx(attention.value, rel=1e-3)


def test_removed_block_is_measured_as_the_identity(load_model: Loader) -> None:
    dense = load_model("llama")
    pruned = copy.deepcopy(dense)
    adapter = match_structure(pruned)
    blocks = adapter.blocks(pruned)
    pruned.model.layers = nn.ModuleList([blocks[0], blocks[2]])
    pruned.config.num_hidden_layers = 2
    ids = prompt_ids(count=1, length=10)[0]
    records = counterfactual_probe(dense, pruned, [0, None, 1], [ids], temperature=TEMPERATURE)
    points = _by_point(records)
    assert {(r.layer, r.sublayer) for r in records} == {(0, "block"), (1, "block"), (2, "block")}
    x, y = _block_output(dense, 1, ids)
    for (space, metric), (value, estimate) in _expected(dense, y, x).items():
        assert points[(1, "block", space, metric)].value == pytest.approx(value, rel=1e-6)
        if estimate is not None:
            assert points[(1, "block", space, metric)].estimate == pytest.approx(estimate, rel=1e-6)
    assert all(r.value == 0.0 for r in records if r.layer != 1)  # kept blocks are unchanged


def test_cost_is_one_block_forward_per_layer_and_sublayer_not_full_passes(load_model: Loader) -> None:
    dense = load_model("llama4")
    pruned = prune_copy(dense)
    calls = {"dense": 0, "pruned": 0, "dense model": 0, "pruned model": 0}

    def counter(name: str) -> Callable[..., None]:
        def hook(*_: Any) -> None:
            calls[name] += 1

        return hook

    handles = [block.register_forward_pre_hook(counter("dense")) for block in dense.model.layers]
    handles += [block.register_forward_pre_hook(counter("pruned")) for block in pruned.model.layers]
    handles += [dense.model.register_forward_pre_hook(counter("dense model"))]
    handles += [pruned.model.register_forward_pre_hook(counter("pruned model"))]
    prompts = prompt_ids(count=3)
    counterfactual_probe(dense, pruned, [0, 1, 2, 3], prompts)
    for handle in handles:
        handle.remove()
    layers = 4
    # per prompt: one dense pass (L block calls), then per layer the dense block with swapped
    # attention, with swapped MLP (2 L) and the pruned block (L); L full passes would be L^2 per kind
    assert calls == {"dense": 3 * 3 * layers, "pruned": 3 * layers, "dense model": 3, "pruned model": 0}


def test_progress_is_reported_per_layer_and_stop_is_honoured(load_model: Loader) -> None:
    dense = load_model("llama")
    pruned = prune_copy(dense)
    seen: list[tuple[int, int]] = []
    counterfactual_probe(
        dense, pruned, [0, 1, 2], prompt_ids(count=2), progress=lambda d, t: seen.append((d, t))
    )
    assert seen == [(done, 6) for done in range(1, 7)]
    asked = iter([False, False, True])
    with pytest.raises(ProbeStopped):
        counterfactual_probe(dense, pruned, [0, 1, 2], prompt_ids(count=2), should_stop=lambda: next(asked))


def test_different_hidden_widths_are_refused_with_the_reason(load_model: Loader) -> None:
    with pytest.raises(ValueError, match="per-layer counterfactual needs equal hidden widths"):
        counterfactual_probe(load_model("llama"), load_model("llama-narrow"), [0, 1, 2], prompt_ids())


def test_token_chunking_does_not_change_the_result(
    load_model: Loader, monkeypatch: pytest.MonkeyPatch
) -> None:
    dense = load_model("llama")
    pruned = prune_copy(dense)
    prompts = prompt_ids(count=2, length=11)
    whole = counterfactual_probe(dense, pruned, [0, 1, 2], prompts)
    monkeypatch.setattr(common, "LOGIT_CHUNK_BYTES", 8 * dense.config.vocab_size * 3)  # 3 tokens a chunk
    chunked = counterfactual_probe(dense, pruned, [0, 1, 2], prompts)
    assert [(r.layer, r.sublayer, r.space, r.metric) for r in whole] == [
        (r.layer, r.sublayer, r.space, r.metric) for r in chunked
    ]
    for a, b in zip(whole, chunked, strict=True):
        assert a.value == pytest.approx(b.value, rel=1e-6)  # fp32 matmuls of other shapes round apart
