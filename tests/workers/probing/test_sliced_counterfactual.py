"""The per-layer counterfactual of a sliced model, block by block through its kept bases: exactly no
shift at sparsity 0 (every basis is then a rotation, so a wrong map would show), a real one above,
and the same bases back from the artifact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.workers.slicing.tiny import build, token_ids
from workers.probing import counterfactual_probe, counterfactual_unavailable
from workers.slicing.artifacts import load_bases, load_sliced, save_sliced
from workers.slicing.engine import slice_model
from workers.slicing.stock import slice_model_stock

SLICERS: dict[str, Any] = {"per-layer": slice_model, "stock": slice_model_stock}
PROMPTS = [token_ids(1, 10, seed=seed)[0] for seed in (4, 5)]


def _sliced(layout: str, sparsity: float, case: str = "llama") -> tuple[Any, Any, Any]:
    dense, sliced = build(case), build(case)
    report = SLICERS[layout](sliced, token_ids(4, 16, seed=1), None, sparsity)
    return dense, sliced, report


def _block_records(records: list[Any], space: str, metric: str) -> dict[int, float]:
    return {
        r.layer: r.value for r in records if r.space == space and r.metric == metric and r.sublayer == "block"
    }


CASES = [("per-layer", "llama"), ("stock", "llama"), ("per-layer", "gemma3")]


@pytest.mark.parametrize(("layout", "case"), CASES)
def test_a_model_sliced_at_sparsity_zero_shows_no_shift_through_its_bases(layout: str, case: str) -> None:
    dense, sliced, report = _sliced(layout, 0.0, case)
    layers = list(range(dense.config.num_hidden_layers))
    records = counterfactual_probe(dense, sliced, layers, PROMPTS, bases=report.bases)
    assert {r.sublayer for r in records} == {"block"}
    angle = _block_records(records, "embedding", "1-cos")
    kl = _block_records(records, "probs", "kl")
    assert set(angle) == set(kl) == set(layers)
    assert max(angle.values()) < 1e-6 and max(kl.values()) < 1e-7


@pytest.mark.parametrize(("layout", "case"), CASES)
def test_a_sliced_model_shows_its_shift_block_by_block(layout: str, case: str) -> None:
    dense, sliced, report = _sliced(layout, 0.5, case)
    layers = list(range(dense.config.num_hidden_layers))
    records = counterfactual_probe(dense, sliced, layers, PROMPTS, bases=report.bases)
    assert min(_block_records(records, "embedding", "1-cos").values()) > 1e-3
    assert min(_block_records(records, "probs", "kl").values()) > 1e-4


def test_without_bases_a_sliced_model_is_refused_with_the_reason() -> None:
    dense, sliced, _ = _sliced("per-layer", 0.25)
    reason = counterfactual_unavailable(dense, sliced, None)
    assert reason is not None and "kept no bases" in reason
    with pytest.raises(ValueError, match="kept no bases"):
        counterfactual_probe(dense, sliced, [0, 1], PROMPTS)


@pytest.mark.parametrize("layout", ["per-layer", "stock"])
def test_the_artifact_keeps_the_bases_and_the_reloaded_model_shifts_alike(
    layout: str, tmp_path: Path
) -> None:
    dense, sliced, report = _sliced(layout, 0.25, case="qwen2")
    save_sliced(sliced, report, tmp_path, source_model_id="tiny/qwen2", revision=None, calibration={})
    bases = load_bases(tmp_path)
    assert bases is not None and len(bases) == len(report.bases) == 3
    assert all(torch.equal(kept, saved) for kept, saved in zip(bases, report.bases, strict=True))
    reloaded = load_sliced(tmp_path)
    expected = counterfactual_probe(dense, sliced, [0, 1], PROMPTS, bases=report.bases)
    again = counterfactual_probe(dense, reloaded, [0, 1], PROMPTS, bases=bases)
    assert [(r.layer, r.space, r.metric, r.value) for r in again] == [
        (r.layer, r.space, r.metric, r.value) for r in expected
    ]


def test_bases_are_optional_and_a_folder_without_them_says_so(tmp_path: Path) -> None:
    sliced = build("llama")
    report = slice_model(sliced, token_ids(4, 16, seed=1), None, 0.25, keep_bases=False)
    assert report.bases is None and "bases" not in report.to_dict()
    save_sliced(sliced, report, tmp_path, source_model_id="tiny/llama", revision=None, calibration={})
    assert load_bases(tmp_path) is None and not (tmp_path / "slicing_bases.st").exists()
