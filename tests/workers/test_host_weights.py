"""Weights read into the process instead of left mapped from their safetensors files."""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from core.model_sources import resolve_model
from core.settings import Settings
from tests.tiny_models import build_tiny_causal_lm
from workers.host_weights import HOST_SHARE, choose_home, mapped_files, read_into_memory
from workers.loading import load_copy, load_model


@pytest.fixture
def tied_dir(tmp_path: Path) -> Path:
    return build_tiny_causal_lm(tmp_path / "tied", tie_word_embeddings=True)


def test_reading_into_memory_keeps_every_value_and_the_tie_and_closes_the_files_map(tied_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tied_dir, local_files_only=True, dtype=torch.float32)
    stored = {  # copies: load_file's own tensors are views of a map of the file too
        name: tensor.clone()
        for path in tied_dir.glob("*.safetensors")
        for name, tensor in load_file(path).items()
    }
    gc.collect()
    assert mapped_files(tied_dir), "transformers is expected to map the weights file"

    host = read_into_memory(model, tied_dir, "test")

    assert mapped_files(tied_dir) == []  # every mapped view was replaced, so the map closed
    assert host.home == "memory" and host.tensors_left == 0
    assert host.tensors_read == len(stored)
    assert host.bytes_read == sum(tensor.numel() * tensor.element_size() for tensor in stored.values())
    state = model.state_dict()
    for name, tensor in stored.items():
        assert torch.equal(state[name], tensor), name
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_a_tensor_the_model_holds_in_another_dtype_is_left_as_loaded(tied_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tied_dir, local_files_only=True, dtype=torch.bfloat16)
    host = read_into_memory(model, tied_dir)
    assert host.tensors_read == 0 and host.tensors_left > 0  # the bf16 copies are not the file's
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_a_model_too_large_for_the_host_stays_mapped() -> None:
    assert choose_home(int(HOST_SHARE * 1000), available_bytes=1000)[0] == "memory"
    home, reason = choose_home(int(HOST_SHARE * 1000) + 1, available_bytes=1000)
    assert home == "mapped" and "left mapped" in reason


def test_cpu_loads_record_their_host_weights_in_the_memory_plan(
    tied_dir: Path, worker_settings: Callable[..., Settings]
) -> None:
    settings = worker_settings(model_roots=[tied_dir.parent])
    loaded = load_model(resolve_model(str(tied_dir), settings), settings, device="cpu")
    copy = load_copy(loaded)
    for each in (loaded, copy):
        host = each.memory_plan.host_weights
        assert host is not None and host.home == "memory" and host.tensors_read > 0
        assert each.memory_plan.record()["host_weights"]["home"] == "memory"
    assert mapped_files(tied_dir) == []
