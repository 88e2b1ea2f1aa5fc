"""prune_model's contract: argument checks, progress and stop, parameter counts, the report."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tests.workers.pruning.tiny import build, calibration, weights_by_name
from workers.architectures import match_structure
from workers.block_inputs import capture_block_inputs, home_device
from workers.pruning import PruningStopped, load_pruned, prune_model, save_pruned
from workers.pruning.engine import count_parameters


@pytest.mark.parametrize(
    ("method", "sparsity", "pattern", "message"),
    [
        (
            "wnada",
            0.5,
            "unstructured",
            "unknown pruning method 'wnada'; use one of: magnitude, magnitude-row, wanda",
        ),
        ("wanda", 0.5, "3:4", "unknown sparsity pattern '3:4'; use one of: unstructured, 2:4, 4:8"),
        ("shortgpt", 0.5, "2:4", "drops whole layers and takes no sparsity pattern.*leave pattern unset"),
        ("wanda", 0.6, "2:4", "pattern 2:4 zeroes exactly 0.5 of the weights; pass sparsity=0.5"),
        ("sparsegpt", 0.5, "4:8", None),  # valid: checked below for calibration instead
        ("magnitude", 1.0, "unstructured", "in \\[0, 1\\)"),
        ("magnitude", -0.1, "unstructured", "in \\[0, 1\\)"),
        ("attention-drop", 0.8, None, "drops 2 of 2 layers, leaving none; pass a sparsity below 0.75"),
    ],
)
def test_bad_arguments_raise_value_errors_that_say_the_fix(
    method: str, sparsity: float, pattern: str | None, message: str | None
) -> None:
    model = build("llama")
    if message is None:
        with pytest.raises(
            ValueError, match=r"needs calibration_ids.*only 'magnitude', 'magnitude-row' run without data"
        ):
            prune_model(model, method, sparsity, pattern=pattern)
        return
    with pytest.raises(ValueError, match=message):
        prune_model(model, method, sparsity, pattern=pattern, calibration_ids=calibration())


def test_bad_calibration_raises_value_errors() -> None:
    model = build("llama")
    with pytest.raises(ValueError, match="must be \\(N, T\\)"):
        prune_model(model, "wanda", 0.5, calibration_ids=calibration()[0])
    with pytest.raises(ValueError, match="no unpadded token"):
        prune_model(model, "wanda", 0.5, calibration_ids=calibration(), attention_mask=torch.zeros(4, 16))
    with pytest.raises(ValueError, match="batch_size must be positive"):
        prune_model(model, "wanda", 0.5, calibration_ids=calibration(), batch_size=0)


def test_magnitude_needs_no_calibration_and_counts_removed_weights_by_hand() -> None:
    model = build("llama")  # D 64, q/o 64x64, k/v 32x64, gate/up 128x64, down 64x128; 2 blocks
    dense = count_parameters(model)
    by_row = build("llama")
    report = prune_model(model, "magnitude", 0.3)
    row_report = prune_model(by_row, "magnitude-row", 0.3)
    prunable = {(64, 64): 2, (32, 64): 2, (128, 64): 2, (64, 128): 1}  # (out, in) -> linears per block
    per_layer = sum(count * math.floor(0.3 * out * inp + 1e-9) for (out, inp), count in prunable.items())
    per_row = sum(count * out * math.floor(0.3 * inp) for (out, inp), count in prunable.items())  # 19 or 38
    prunable_per_block = sum(count * out * inp for (out, inp), count in prunable.items())
    for pruned, zeroed_per_block in ((report, per_layer), (row_report, per_row)):
        assert pruned.params_before == dense
        assert pruned.params_after == dense - 2 * zeroed_per_block
        assert pruned.achieved_sparsity == pytest.approx(zeroed_per_block / prunable_per_block)
        assert pruned.dropped_layers == [] and pruned.scores == [] and pruned.layer_map == [0, 1]
        assert pruned.calibration_tokens == 0


@pytest.mark.parametrize("method", ["magnitude", "wanda", "sparsegpt", "mlp-drop", "shortgpt"])
def test_progress_reports_every_block_and_should_stop_stops_before_a_block(method: str) -> None:
    calls: list[tuple[int, int]] = []
    prune_model(
        build("llama"), method, 0.5, calibration_ids=calibration(), progress=lambda *a: calls.append(a)
    )
    assert calls == [(0, 2), (1, 2), (2, 2)]
    asked: list[int] = []

    def stop_after_one_block() -> bool:
        asked.append(1)
        return len(asked) > 1

    with pytest.raises(PruningStopped, match="before block 1 of 2"):
        prune_model(
            build("llama"), method, 0.5, calibration_ids=calibration(), should_stop=stop_after_one_block
        )


def test_report_is_json_serialisable() -> None:
    report = prune_model(build("llama", layers=4), "shortgpt", 0.25, calibration_ids=calibration())
    data = json.loads(json.dumps(report.to_dict()))
    assert data["method"] == "shortgpt" and data["pattern"] is None and data["num_layers"] == 4
    assert data["param_fraction_removed"] == pytest.approx(report.param_fraction_removed)
    assert len(data["scores"]) == 4 and data["layer_map"].count(None) == 1


def test_wanda_2_4_artifact_round_trips_with_its_zeros(tmp_path: Path) -> None:
    model = build("gpt2")
    ids = calibration()
    report = prune_model(model, "wanda", 0.5, pattern="2:4", calibration_ids=ids)
    save_pruned(model, report, tmp_path / "out", model_id="tiny", revision="abc", calibration_record=None)
    loaded, description = load_pruned(tmp_path / "out")
    assert description["pattern"] == "2:4" and description["revision"] == "abc"
    assert description["params_after"] == report.params_after
    for name, weight in weights_by_name(model).items():
        assert torch.equal(weights_by_name(loaded)[name], weight), name
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
    with pytest.raises(FileNotFoundError, match="not a \\(complete\\) pruned model folder"):
        load_pruned(tmp_path)


@pytest.mark.parametrize("case", ["llama", "gpt2", "phi"])
def test_captured_block_inputs_run_through_the_blocks_reproduce_the_logits(case: str) -> None:
    model = build(case)
    adapter = match_structure(model)
    ids = calibration()
    home = home_device(model)
    batches = capture_block_inputs(model, adapter, ids, torch.ones_like(ids, dtype=torch.bool), 3, home, home)
    assert [batch.hidden.shape[0] for batch in batches] == [3, 1]
    outputs = []
    with torch.no_grad():
        for batch in batches:
            hidden = batch.hidden
            for index, block in enumerate(adapter.blocks(model)):
                args, kwargs = batch.call(index)
                result = block(hidden, *args, **kwargs)
                hidden = result[0] if isinstance(result, tuple) else result
            outputs.append(adapter.lm_head(model)(adapter.final_norm(model)(hidden)))
        assert torch.allclose(torch.cat(outputs), model(input_ids=ids).logits, atol=1e-5, rtol=0)


def test_shortgpt_refuses_gpt2_whose_attention_scale_depends_on_the_layer_index() -> None:
    model = build("gpt2", scale_attn_by_inverse_layer_idx=True)
    with pytest.raises(ValueError, match=r"scale_attn_by_inverse_layer_idx.*use attention-drop or mlp-drop"):
        prune_model(model, "shortgpt", 0.5, calibration_ids=calibration())
