"""Probing tests run tiny models on one torch thread (restored afterwards), and share tiny model
folders built once per session with tests/tiny_models.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, PreTrainedModel

from tests.tiny_models import build_tiny_causal_lm


@pytest.fixture(autouse=True)
def _one_torch_thread(one_torch_thread: None) -> None:
    """Every test here runs on one torch thread (tests/workers/conftest.py)."""


# Wider initial weights than HF's 0.02 make the tiny models' distributions peaked, so deviations
# are far from zero and comparisons meaningful.
_LAYERS = {"llama": 3, "gpt2": 3, "opt": 2, "gemma3_text": 2}


@pytest.fixture(scope="session")
def probe_model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("probing-models")
    dirs = {}
    for family, layers in _LAYERS.items():
        depth = {"n_layer": layers} if family == "gpt2" else {"num_hidden_layers": layers}
        dirs[family] = build_tiny_causal_lm(root / family, family, seed=1, initializer_range=0.2, **depth)
    dirs["llama4"] = build_tiny_causal_lm(root / "llama4", "llama", seed=2, num_hidden_layers=4)
    dirs["llama-narrow"] = build_tiny_causal_lm(
        root / "llama-narrow", "llama", seed=3, hidden_size=48, num_hidden_layers=3
    )
    return dirs


@pytest.fixture
def load_model(probe_model_dirs: dict[str, Path]) -> Callable[[str], PreTrainedModel]:
    """A fresh fp32 eval-mode copy of one of the session's tiny models."""

    def load(name: str) -> PreTrainedModel:
        return AutoModelForCausalLM.from_pretrained(probe_model_dirs[name], local_files_only=True).eval()

    return load
