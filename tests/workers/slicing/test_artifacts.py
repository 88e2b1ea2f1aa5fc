"""Saving a sliced model and loading it back gives the same model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.workers.slicing.tiny import FAMILY_CASES, build, logits, token_ids
from workers.slicing.artifacts import SLICING_CONFIG_FILE, load_sliced, save_sliced
from workers.slicing.engine import count_parameters, slice_model

CALIBRATION = {"corpus": "random token ids", "sequences": 4, "seqlen": 16, "seed": 1}


@pytest.mark.parametrize("case", [*FAMILY_CASES, "opt_no_bias", "gpt_neox_sequential"])
def test_saved_and_loaded_sliced_model_gives_identical_logits(case: str, tmp_path: Path) -> None:
    model = build(case)
    report = slice_model(model, token_ids(4, 16, seed=1), None, 0.25)
    ids = token_ids(2, 12, seed=2)

    save_sliced(
        model, report, tmp_path, source_model_id=f"tiny/{case}", revision="abc123", calibration=CALIBRATION
    )
    loaded = load_sliced(tmp_path)

    assert torch.equal(logits(loaded, ids), logits(model, ids))
    assert count_parameters(loaded) == report.params_after


def test_slicing_config_records_widths_source_and_calibration(tmp_path: Path) -> None:
    model = build("qwen2")
    report = slice_model(model, token_ids(4, 16, seed=1), None, 0.25)

    save_sliced(
        model, report, tmp_path, source_model_id="tiny/qwen2", revision="abc123", calibration=CALIBRATION
    )

    description = json.loads((tmp_path / SLICING_CONFIG_FILE).read_text())
    assert description["family"] == "llama"
    assert description["source_model_id"] == "tiny/qwen2" and description["revision"] == "abc123"
    assert description["calibration"] == CALIBRATION
    assert description["widths"]["embedding"] == 48 and description["widths"]["head"] == 64
    assert description["params_after"] == report.params_after
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "prunecast_sliced" and config["base_config"]["model_type"] == "qwen2"
    assert config["base_config"]["tie_word_embeddings"] is False
    assert (
        config["auto_map"]["AutoModelForCausalLM"] == "modeling_prunecast_sliced.PrunecastSlicedForCausalLM"
    )
    assert config["sliced"]["widths"] == description["widths"]
    assert (tmp_path / "model.safetensors").is_file() and (
        tmp_path / "modeling_prunecast_sliced.py"
    ).is_file()


def test_loading_a_folder_without_slicing_config_explains_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"slicing_config\.json"):
        load_sliced(tmp_path)
