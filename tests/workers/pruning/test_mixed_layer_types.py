"""Models whose layers mix attention types (Gemma-3's sliding and full layers, Qwen2 with sliding
layers): every block is calibrated on its own type's masks and rotary tables, and every pruner runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel

from tests.workers.pruning.tiny import MIXED, build, calibration, scale_writers
from workers.architectures import match_structure
from workers.block_inputs import capture_block_inputs, home_device
from workers.pruning import prune_model, save_pruned
from workers.pruning.engine import ENGINES
from workers.pruning.linears import block_linears, weight_out_in
from workers.pruning.sparsegpt import HessianAccumulator, sparsegpt_prune
from workers.pruning.wanda import FeatureSquares, prune_linear_by_wanda

CASES = tuple(MIXED)


def _replayed_logits(model: PreTrainedModel, ids: torch.Tensor, *, own_calls: bool) -> torch.Tensor:
    """Logits from the captured block inputs run through every block: with each block's own call,
    or (own_calls False) with block 0's call for all, which is what a single capture would replay."""
    adapter = match_structure(model)
    home = home_device(model)
    batches = capture_block_inputs(model, adapter, ids, torch.ones_like(ids, dtype=torch.bool), 3, home, home)
    outputs = []
    with torch.no_grad():
        for batch in batches:
            hidden = batch.hidden
            for index, block in enumerate(adapter.blocks(model)):
                args, kwargs = batch.call(index if own_calls else 0)
                hidden = block(hidden, *args, **kwargs)
            outputs.append(adapter.lm_head(model)(adapter.final_norm(model)(hidden)))
    return torch.cat(outputs)


@pytest.mark.parametrize("case", CASES)
def test_every_layer_type_gets_its_own_masks_and_rotary_tables(case: str) -> None:
    model = build(case)
    ids = calibration()
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    assert torch.allclose(_replayed_logits(model, ids, own_calls=True), expected, atol=1e-5, rtol=0)
    # The control: block 0's call replayed everywhere is a different model (the window matters).
    wrong = _replayed_logits(model, ids, own_calls=False)
    assert float((wrong - expected).abs().max()) > 1e-2


def _reference_sequential(model: PreTrainedModel, ids: torch.Tensor, method: str, sparsity: float) -> None:
    """Wanda or SparseGPT block by block, each block's linear inputs read by hooks during a full
    forward of the model as pruned so far: no captured calls involved."""
    adapter = match_structure(model)
    for block in adapter.blocks(model):
        linears = block_linears(adapter, block)
        statistic = FeatureSquares if method == "wanda" else HessianAccumulator
        statistics = {
            path: statistic(weight_out_in(module).shape[1], torch.device("cpu")) for path, module in linears
        }

        def hook_for(path: str, statistics: dict[str, Any] = statistics) -> Any:
            def record(_module: nn.Module, args: tuple[Any, ...]) -> None:
                statistics[path].add(args[0].reshape(-1, args[0].shape[-1]).clone())

            return record

        handles = [module.register_forward_pre_hook(hook_for(path)) for path, module in linears]
        with torch.no_grad():
            model(input_ids=ids)
        for handle in handles:
            handle.remove()
        with torch.no_grad():
            for path, module in linears:
                if method == "wanda":
                    prune_linear_by_wanda(module, statistics[path], sparsity, "unstructured")
                else:
                    weight = weight_out_in(module)
                    pruned, _ = sparsegpt_prune(weight, statistics[path].matrix, sparsity, "unstructured")
                    weight.copy_(pruned)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_calibrated_pruners_equal_a_full_forward_reference(case: str, method: str) -> None:
    ids = calibration()
    model, reference = build(case), build(case)
    prune_model(model, method, 0.5, calibration_ids=ids, batch_size=len(ids))
    _reference_sequential(reference, ids, method, 0.5)
    adapter = match_structure(model)
    for index, (block, expected) in enumerate(
        zip(adapter.blocks(model), adapter.blocks(reference), strict=True)
    ):
        for (path, module), (_, other) in zip(
            block_linears(adapter, block), block_linears(adapter, expected), strict=True
        ):
            got, want = weight_out_in(module), weight_out_in(other)
            assert torch.equal(got == 0, want == 0), f"block {index} {path}: masks differ"
            assert torch.allclose(got, want, atol=1e-5, rtol=1e-4), f"block {index} {path}"


SPARSITY = {"attention-drop": 0.25, "mlp-drop": 0.25, "shortgpt": 0.25}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("method", sorted(ENGINES))
def test_every_pruner_runs_and_the_result_reloads_with_stock_transformers(
    case: str, method: str, tmp_path: Path
) -> None:
    model = build(case)
    ids = calibration()
    layers = model.config.num_hidden_layers
    report = prune_model(model, method, SPARSITY.get(method, 0.5), calibration_ids=ids)
    if method in SPARSITY:
        assert len(report.dropped_layers) == 1
    else:
        assert report.achieved_sparsity == pytest.approx(0.5, abs=0.01)
    if method == "shortgpt":  # every kept layer keeps its own attention type
        dense_types = MIXED[case]().layer_types
        kept = [kind for index, kind in enumerate(dense_types) if index not in report.dropped_layers]
        assert model.config.layer_types == kept and model.config.num_hidden_layers == layers - 1
    save_pruned(model, report, tmp_path, model_id="tiny", revision=None, calibration_record={"seed": 0})
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-6, rtol=0)


def _zero_output(_module: nn.Module, _args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(output)


@pytest.mark.parametrize(
    ("branch", "method", "layer"), [("attention", "attention-drop", 1), ("mlp", "mlp-drop", 2)]
)
def test_gemma_branch_drops_score_the_branch_after_its_output_norm(
    branch: str, method: str, layer: int
) -> None:
    # Gemma normalises each branch's output before the add: shrinking the writers would change
    # nothing, so the branch is quietened at its output norm's gain, and must be the one dropped.
    model, reference = build("gemma3"), build("gemma3")
    for each in (model, reference):
        scale_writers(each, layer, branch)
    ids = calibration()
    report = prune_model(model, method, 0.25, calibration_ids=ids)
    assert report.dropped_layers == [layer]
    assert report.scores[layer] == max(report.scores) and report.scores[layer] > 0.999

    output_norm = match_structure(reference).branch_outputs(reference.model.layers[layer], branch)[0]
    output_norm.register_forward_hook(_zero_output)  # the reference: the branch removed outright
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, reference(input_ids=ids).logits, atol=1e-5, rtol=0)
