"""Attention drop and MLP drop: which branches go, and that zeroing writers equals removing the branch."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from tests.workers.pruning.tiny import build, calibration, scale_writers
from workers.architectures import UnsupportedArchitectureError, match_structure
from workers.pruning import prune_model
from workers.pruning.engine import count_parameters


def _zero_output(_module: nn.Module, _args: tuple[Any, ...], output: Any) -> Any:
    """Forward hook: the module contributes nothing (tuples keep their other entries)."""
    if isinstance(output, tuple):
        return (torch.zeros_like(output[0]), *output[1:])
    return torch.zeros_like(output)


def test_attention_drop_removes_the_near_identity_attention_and_matches_a_model_without_it() -> None:
    model = build("llama", layers=4)
    scale_writers(model, 2, "attention")
    ids = calibration()
    report = prune_model(model, "attention-drop", 0.25, calibration_ids=ids)
    assert report.dropped_layers == [2]
    assert report.scores[2] == max(report.scores) and report.scores[2] > 0.999
    assert report.layer_map == [0, 1, 2, 3] and report.achieved_sparsity == 0.25
    assert report.pattern is None

    reference = build("llama", layers=4)
    scale_writers(reference, 2, "attention")
    reference.model.layers[2].self_attn.register_forward_hook(_zero_output)
    with torch.no_grad():
        expected = reference(input_ids=ids).logits
        actual = model(input_ids=ids).logits
    assert torch.allclose(actual, expected, atol=1e-5, rtol=0)


def test_attention_drop_chooses_the_layers_with_the_highest_cosine() -> None:
    model = build("llama", layers=4)
    report = prune_model(model, "attention-drop", 0.5, calibration_ids=calibration())
    ranked = sorted(range(4), key=lambda layer: -report.scores[layer])
    assert report.dropped_layers == sorted(ranked[:2])
    adapter = match_structure(model)
    for index, block in enumerate(adapter.blocks(model)):
        dropped = index in report.dropped_layers
        writer = adapter.attn_writers(block)[0]
        assert bool((writer.weight == 0).all()) == dropped
        assert bool((adapter.mlp_writers(block)[0].weight == 0).all()) is False


def test_mlp_drop_on_a_parallel_residual_family_scores_against_the_block_input() -> None:
    model = build("gpt_neox", layers=3)
    scale_writers(model, 0, "mlp")
    ids = calibration()
    report = prune_model(model, "mlp-drop", 1 / 3, calibration_ids=ids)
    assert report.dropped_layers == [0]
    reference = build("gpt_neox", layers=3)
    scale_writers(reference, 0, "mlp")
    reference.gpt_neox.layers[0].mlp.register_forward_hook(_zero_output)
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, reference(input_ids=ids).logits, atol=1e-5, rtol=0)


def test_dropped_branch_parameters_are_counted_by_hand() -> None:
    model = build("llama", layers=2)  # D 64, 4 heads of 16, 2 KV heads, MLP 128, no biases
    dense = count_parameters(model)
    attention = prune_model(model, "attention-drop", 0.5, calibration_ids=calibration())
    q_and_o, k_and_v, norm = 2 * 64 * 64, 2 * 64 * 32, 64
    assert attention.params_before == dense
    assert attention.params_after == dense - (q_and_o + k_and_v + norm)
    mlp = prune_model(build("llama", layers=2), "mlp-drop", 0.5, calibration_ids=calibration())
    assert mlp.params_after == dense - (3 * 64 * 128 + norm)
    assert mlp.param_fraction_removed == pytest.approx((3 * 64 * 128 + norm) / dense)


def _halve_output(_module: nn.Module, _args: tuple[Any, ...], output: Any) -> Any:
    return (output[0] * 0.5, *output[1:]) if isinstance(output, tuple) else output * 0.5


def test_blocks_that_are_not_a_plain_residual_sum_are_refused_for_branch_drops() -> None:
    model = build("llama")
    model.model.layers[1].register_forward_hook(
        _halve_output
    )  # y = (x + attn + mlp) / 2, like a scaled residual
    with pytest.raises(UnsupportedArchitectureError, match="does not compute input \\+ attention \\+ MLP"):
        prune_model(model, "mlp-drop", 0.5, calibration_ids=calibration())
