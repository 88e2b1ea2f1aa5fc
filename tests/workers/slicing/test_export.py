"""The per-layer layout exported: `from_pretrained(folder, trust_remote_code=True)` in a fresh
interpreter without the project rebuilds the sliced model from the portable code the folder
carries, with the engine's logits and greedy tokens (KV cache) for every supported family."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.workers.slicing.fresh_reload import greedy, reload_fresh, write_inputs
from tests.workers.slicing.tiny import FAMILY_CASES, build, relative_error, token_ids
from workers.architectures import GemmaAdapter
from workers.slicing.artifacts import load_sliced, save_sliced
from workers.slicing.engine import count_parameters, slice_model
from workers.slicing.portable.sliced_modules import FamilyLayout

CASES = (*FAMILY_CASES, "opt_no_bias", "gpt_neox_sequential")
PROMPT = token_ids(2, 6, seed=3)
NEW_TOKENS = 10


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every family sliced per layer at s = 0.25, saved, reloaded with and without remote code."""
    root = tmp_path_factory.mktemp("per-layer")
    cases: dict[str, dict[str, Any]] = {}
    for case in CASES:
        model = build(case)
        report = slice_model(model, token_ids(4, 16, seed=1), None, 0.25)
        folder = root / case
        save_sliced(model, report, folder, source_model_id=f"tiny/{case}", revision=None, calibration={})
        ids = token_ids(2, 12, seed=2)
        write_inputs(folder, ids, PROMPT, NEW_TOKENS)
        with torch.no_grad():
            engine_logits = model(ids).logits
        cases[case] = {"model": model, "folder": folder, "ids": ids, "logits": engine_logits}
    folders = [cases[case]["folder"] for case in CASES]
    for case, result in zip(
        CASES, reload_fresh(folders, root / "trusted", trust_remote_code=True), strict=True
    ):
        cases[case]["trusted"] = result
    for case, result in zip(CASES, reload_fresh(folders[:1], root / "untrusted"), strict=False):
        cases[case]["untrusted"] = result
    return cases


@pytest.mark.parametrize("case", CASES)
def test_per_layer_export_with_remote_code_gives_the_engine_logits(
    case: str, exports: dict[str, dict[str, Any]]
) -> None:
    export = exports[case]
    assert "error" not in export["trusted"], export["trusted"]
    assert relative_error(export["trusted"]["logits"], export["logits"]) < 1e-6
    assert export["trusted"]["parameters"] == count_parameters(export["model"])


@pytest.mark.parametrize("case", CASES)
def test_per_layer_export_generates_the_engine_models_greedy_tokens_with_a_kv_cache(
    case: str, exports: dict[str, dict[str, Any]]
) -> None:
    export = exports[case]
    expected = greedy(export["model"], PROMPT, NEW_TOKENS)
    assert torch.equal(greedy(export["model"], PROMPT, NEW_TOKENS, use_cache=False), expected)
    assert torch.equal(export["trusted"]["generated"], expected)
    assert torch.equal(greedy(load_sliced(export["folder"]), PROMPT, NEW_TOKENS), expected)


def test_without_remote_code_the_folder_is_refused_not_misread(exports: dict[str, dict[str, Any]]) -> None:
    error = exports[CASES[0]]["untrusted"]["error"]
    assert "prunecast_sliced" in error or "trust_remote_code" in error, error


def test_folders_written_before_the_remote_code_config_still_load(tmp_path: Path) -> None:
    model = build("qwen2")
    report = slice_model(model, token_ids(4, 16, seed=1), None, 0.25)
    save_sliced(model, report, tmp_path, source_model_id="tiny/qwen2", revision=None, calibration={})
    dense_config = model.config
    dense_config.tie_word_embeddings = False
    dense_config.save_pretrained(tmp_path)  # the format of earlier artifacts: the dense config itself
    ids = token_ids(2, 12, seed=2)
    with torch.no_grad():
        assert torch.equal(load_sliced(tmp_path)(ids).logits, model(ids).logits)


def test_declarations_written_before_branch_output_norms_rebuild_a_layout_without_them() -> None:
    """The remote code rebuilds the family from config.json's declaration; older folders lack the
    output-norm keys, and their layout then has none, as their models had."""
    old = GemmaAdapter().declaration()
    assert FamilyLayout.from_declaration(old).output_norm_path("mlp") == "post_feedforward_layernorm"
    for key in ("attn_output_norm_path", "mlp_output_norm_path"):
        del old[key]
    layout = FamilyLayout.from_declaration(old)
    assert layout.output_norm_path("attention") is None and layout.output_norm_path("mlp") is None
