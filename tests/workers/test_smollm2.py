"""The packaged SmolLM2-135M converts once, reloads identically, and scores a plausible WikiText-2 PPL."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from core.model_sources import ModelSource, ModelSourceError, resolve_model
from core.settings import Settings
from workers.data import load_wikitext2_test, tokenize_corpus
from workers.evaluation.perplexity import effective_seqlen, perplexity
from workers.loading import CONVERSION_RECORD, LoadedModel, load_model

pytestmark = pytest.mark.slow

SAMPLE = " = Robert Boulter = \n\n Robert Boulter is an English film , television and theatre actor ."


@dataclass
class Converted:
    settings: Settings
    source: ModelSource
    first: LoadedModel
    convert_s: float


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory: pytest.TempPathFactory, shared_data_dir: Path) -> Converted:
    """Convert the packaged GGUF once per test session into a session-scoped cache."""
    home = tmp_path_factory.mktemp("smollm2-home")
    settings = Settings(home=home, cache_dir=home / "cache", data_dir=shared_data_dir, model_roots=[])
    try:
        source = resolve_model("smollm2-135m", settings)
    except ModelSourceError as error:
        pytest.skip(str(error))
    started = time.perf_counter()
    first = load_model(source, settings, device="cpu")
    convert_s = time.perf_counter() - started
    print(f"\nSmolLM2-135M first load (GGUF conversion + load): {convert_s:.1f} s")
    return Converted(settings=settings, source=source, first=first, convert_s=convert_s)


def test_packaged_smollm2_converts_into_the_model_cache(smollm2: Converted) -> None:
    loaded = smollm2.first
    assert loaded.source_kind == "packaged"
    assert loaded.model_id == "smollm2-135m"
    assert loaded.path.parent == smollm2.settings.model_cache_dir / "smollm2-135m"
    assert loaded.revision == loaded.path.name
    assert (loaded.path / "config.json").is_file()
    assert (loaded.path / CONVERSION_RECORD).is_file()
    assert type(loaded.model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in loaded.model.parameters()) == 134_515_008
    assert not hasattr(loaded.model.config, "quantization_config")


def test_cached_reload_gives_identical_logits_to_the_gguf_load(smollm2: Converted) -> None:
    started = time.perf_counter()
    cached = load_model(smollm2.source, smollm2.settings, device="cpu")
    cached_s = time.perf_counter() - started
    print(f"\nSmolLM2-135M cached load: {cached_s:.2f} s (first load {smollm2.convert_s:.1f} s)")
    assert cached.path == smollm2.first.path
    assert cached_s < smollm2.convert_s

    folder, gguf_file = smollm2.source.path.parent, smollm2.source.path.name
    gguf_tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file).eval()
    ids = gguf_tokenizer(SAMPLE, return_tensors="pt").input_ids  # (1, T)
    assert torch.equal(cached.tokenizer(SAMPLE, return_tensors="pt").input_ids, ids)
    with torch.inference_mode():
        expected = gguf_model(ids).logits  # (1, T, V)
        actual = cached.model(ids).logits  # (1, T, V)
    assert torch.equal(actual, expected)


def test_wikitext2_perplexity_of_smollm2_is_in_the_known_ballpark(smollm2: Converted) -> None:
    loaded = smollm2.first
    corpus = load_wikitext2_test(smollm2.settings)
    ids = tokenize_corpus(loaded.tokenizer, corpus, settings=smollm2.settings)
    seqlen = effective_seqlen(loaded.model, 2048)
    assert seqlen == 2048
    result = perplexity(loaded.model, ids, seqlen=seqlen, max_windows=2)
    print(
        f"\nSmolLM2-135M WikiText-2 PPL, seqlen 2048, 2 windows: {result.ppl:.3f} ({result.elapsed_s:.1f} s)"
    )
    assert result.windows == 2
    assert result.tokens_scored == 2 * 2047
    assert math.isfinite(result.ppl)
    assert 12 < result.ppl < 40  # first 20 windows measured 21.20 on these weights
