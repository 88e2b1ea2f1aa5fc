"""ShortGPT: the least influential block goes, and the result is a stock transformers checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.workers.pruning.tiny import build, calibration, scale_writers
from workers.pruning import ARTIFACT_KIND, load_pruned, prune_model, save_pruned
from workers.pruning.engine import count_parameters


@pytest.mark.parametrize(("case", "layers", "target"), [("llama", 4, 1), ("gpt2", 3, 2), ("qwen2", 3, 0)])
def test_shortgpt_removes_the_near_identity_block_and_loads_with_stock_transformers(
    case: str, layers: int, target: int, tmp_path: Path
) -> None:
    model = build(case, layers=layers)
    scale_writers(model, target, "both")
    ids = calibration()
    dense_params = count_parameters(model)
    block_params = sum(p.numel() for p in model.base_model.get_submodule(_blocks(case))[target].parameters())
    report = prune_model(model, "shortgpt", 1 / layers, calibration_ids=ids)

    assert report.dropped_layers == [target]
    assert report.scores[target] == min(report.scores) and report.scores[target] < 1e-3
    assert report.layer_map == [None if i == target else i - (i > target) for i in range(layers)]
    assert report.params_after == count_parameters(model) == dense_params - block_params
    assert model.config.num_hidden_layers == layers - 1
    layer_types = getattr(model.config, "layer_types", None)
    assert layer_types is None or len(layer_types) == layers - 1

    save_pruned(model, report, tmp_path, model_id="tiny", revision=None, calibration_record={"seed": 0})
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.num_hidden_layers == layers - 1
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
    prompt = ids[:1, :6]
    cached = loaded.generate(prompt, max_new_tokens=6, do_sample=False, use_cache=True, pad_token_id=0)
    uncached = model.generate(prompt, max_new_tokens=6, do_sample=False, use_cache=False, pad_token_id=0)
    assert torch.equal(cached, uncached)

    again, description = load_pruned(tmp_path)
    assert description["layer_map"] == report.layer_map and description["method"] == "shortgpt"
    assert description["calibration"] == {"seed": 0} and ARTIFACT_KIND == "pruned-model"
    with torch.no_grad():
        assert torch.equal(again(input_ids=ids).logits, model(input_ids=ids).logits)


def _blocks(case: str) -> str:
    return "h" if case == "gpt2" else "layers"
