"""Loading local model folders, readable load errors, and the once-only packaged conversion."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, T5Config

from core.model_sources import ModelSource, ModelSourceError, resolve_model
from core.settings import Settings
from tests.tiny_models import build_tiny_causal_lm
from workers import loading
from workers.loading import ModelLoadError, conversion_key, ensure_converted, load_model

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_local_tiny_model_loads_in_eval_mode_with_its_tokenizer(
    tiny_llama_dir: Path, worker_settings: Callable[..., Settings]
) -> None:
    settings = worker_settings(model_roots=[tiny_llama_dir.parent])
    loaded = load_model(resolve_model(str(tiny_llama_dir), settings), settings, device="cpu")
    assert loaded.model_id == str(tiny_llama_dir.resolve())
    assert loaded.source_kind == "local"
    assert loaded.device == torch.device("cpu")
    assert loaded.dtype == torch.float32
    assert loaded.path == tiny_llama_dir.resolve()
    assert not loaded.model.training
    assert {p.dtype for p in loaded.model.parameters()} == {torch.float32}
    ids = loaded.tokenizer("hi", return_tensors="pt").input_ids  # (1, 3): BOS + 2 bytes
    assert ids.tolist() == [[256, ord("h"), ord("i")]]
    reference = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, local_files_only=True).eval()
    with torch.no_grad():
        assert torch.equal(loaded.model(ids).logits, reference(ids).logits)


@pytest.mark.parametrize(
    ("requested", "expected"),
    [("bfloat16", torch.bfloat16), ("float16", torch.float16), ("auto", torch.float32)],
)
def test_requested_dtype_is_honoured(
    tiny_llama_dir: Path, worker_settings: Callable[..., Settings], requested: str, expected: torch.dtype
) -> None:
    settings = worker_settings(model_roots=[tiny_llama_dir.parent])
    loaded = load_model(resolve_model(str(tiny_llama_dir), settings), settings, dtype=requested, device="cpu")
    assert loaded.dtype == expected
    assert {p.dtype for p in loaded.model.parameters()} == {expected}


def test_unknown_dtype_and_device_are_rejected(
    tiny_llama_dir: Path, worker_settings: Callable[..., Settings]
) -> None:
    settings = worker_settings(model_roots=[tiny_llama_dir.parent])
    source = resolve_model(str(tiny_llama_dir), settings)
    with pytest.raises(ValueError, match="dtype must be one of"):
        load_model(source, settings, dtype="int8", device="cpu")
    with pytest.raises(ValueError, match="device must be one of"):
        load_model(source, settings, device="tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on hosts without CUDA")
def test_asking_for_cuda_without_it_is_a_load_error(
    tiny_llama_dir: Path, worker_settings: Callable[..., Settings]
) -> None:
    settings = worker_settings(model_roots=[tiny_llama_dir.parent])
    with pytest.raises(ModelLoadError, match="no usable CUDA device"):
        load_model(resolve_model(str(tiny_llama_dir), settings), settings, device="cuda")


def test_folder_without_config_is_refused_with_a_readable_message(
    tmp_path: Path, worker_settings: Callable[..., Settings]
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    settings = worker_settings()
    with pytest.raises(ModelSourceError, match=r"no config\.json"):
        resolve_model(str(empty), settings)
    with pytest.raises(ModelLoadError, match=r"model 'empty': cannot read its config"):
        load_model(ModelSource(kind="local", model_id="empty", path=empty), settings, device="cpu")


def test_known_architecture_that_is_not_a_causal_lm_is_refused(
    tmp_path: Path, worker_settings: Callable[..., Settings]
) -> None:
    folder = tmp_path / "t5"
    T5Config(architectures=["T5ForConditionalGeneration"]).save_pretrained(folder)
    settings = worker_settings()
    with pytest.raises(
        ModelLoadError, match=r"architecture T5ForConditionalGeneration .* is not a causal LM"
    ):
        load_model(resolve_model(str(folder), settings), settings, device="cpu")


def test_unknown_model_type_is_refused_with_a_readable_message(
    tmp_path: Path, worker_settings: Callable[..., Settings]
) -> None:
    folder = tmp_path / "mystery"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "frobnicator", "architectures": ["X"]}))
    settings = worker_settings()
    with pytest.raises(
        ModelLoadError, match=r"cannot read its config: model_type .frobnicator. is not an architecture"
    ):
        load_model(resolve_model(str(folder), settings), settings, device="cpu")


def test_folder_with_config_but_no_weights_is_a_load_error(
    tmp_path: Path, worker_settings: Callable[..., Settings]
) -> None:
    folder = build_tiny_causal_lm(tmp_path / "no-weights")
    for weights in folder.glob("*.safetensors"):
        weights.unlink()
    settings = worker_settings()
    with pytest.raises(ModelLoadError, match="cannot load weights"):
        load_model(resolve_model(str(folder), settings), settings, device="cpu")


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_corrupt_weights_file_is_a_load_error_naming_the_file(
    tmp_path: Path, worker_settings: Callable[..., Settings], damage: str
) -> None:
    folder = build_tiny_causal_lm(tmp_path / f"corrupt-{damage}")
    (weights,) = folder.glob("*.safetensors")
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"\xff" * 64 + data[64:])
    settings = worker_settings()
    with pytest.raises(ModelLoadError, match=rf"the weights file {weights.resolve()} is unreadable"):
        load_model(resolve_model(str(folder), settings), settings, device="cpu")


def test_importing_the_worker_modules_does_not_initialise_cuda() -> None:
    modules = "workers.loading, workers.evaluation.perplexity, workers.data"
    code = f"import torch, {modules}; print(torch.cuda.is_initialized())"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip().splitlines()[-1] == "False"


def _fake_packaged(tmp_path: Path) -> ModelSource:
    gguf = tmp_path / "pkg" / "Fake.Q4.gguf"
    gguf.parent.mkdir(parents=True)
    gguf.write_bytes(b"GGUF" + bytes(60))
    return ModelSource(kind="packaged", model_id="fake-model", path=gguf)


def test_concurrent_first_loads_convert_a_packaged_model_once(
    tmp_path: Path, worker_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _fake_packaged(tmp_path)
    settings = worker_settings()
    conversions: list[Path] = []

    def slow_convert(_source: ModelSource, target: Path) -> None:
        conversions.append(target)
        time.sleep(0.3)  # long enough that the other thread arrives mid-conversion
        (target / "config.json").write_text("{}")

    monkeypatch.setattr(loading, "_convert_gguf", slow_convert)
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(ensure_converted(source, settings))) for _ in "ab"
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    expected = settings.model_cache_dir / "fake-model" / conversion_key(source.path)
    assert results == [expected, expected]
    assert len(conversions) == 1
    assert (expected / "config.json").is_file()
    assert not [p for p in expected.parent.iterdir() if "partial" in p.name]


def test_failed_conversion_leaves_no_folder_behind(
    tmp_path: Path, worker_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _fake_packaged(tmp_path)
    settings = worker_settings()

    def broken_convert(_source: ModelSource, target: Path) -> None:
        (target / "half-written").write_text("x")
        raise ModelLoadError("model 'fake-model': cannot read it")

    monkeypatch.setattr(loading, "_convert_gguf", broken_convert)
    with pytest.raises(ModelLoadError, match="cannot read it"):
        ensure_converted(source, settings)
    alias_dir = settings.model_cache_dir / "fake-model"
    assert [p.name for p in alias_dir.iterdir() if not p.name.endswith(".lock")] == []


def test_partial_folder_of_a_killed_conversion_is_cleared_before_converting(
    tmp_path: Path, worker_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _fake_packaged(tmp_path)
    settings = worker_settings()
    alias_dir = settings.model_cache_dir / "fake-model"
    stale = alias_dir / f".{conversion_key(source.path)}.partial-killed"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"half")
    monkeypatch.setattr(
        loading, "_convert_gguf", lambda _s, target: (target / "config.json").write_text("{}")
    )
    final = ensure_converted(source, settings)
    assert sorted(p.name for p in alias_dir.iterdir() if not p.name.endswith(".lock")) == [final.name]


def test_conversion_key_changes_with_the_packaged_file(tmp_path: Path) -> None:
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(bytes(10))
    first = conversion_key(gguf)
    gguf.write_bytes(bytes(11))
    assert conversion_key(gguf) != first
    assert len(first) == 12
