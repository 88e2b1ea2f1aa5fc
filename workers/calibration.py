"""Calibration batches: the token windows SliceGPT's PCAs are computed on (docs/science.md §1, step 7).

A corpus is tokenised once as one stream; `num_sequences` windows of `seqlen` tokens start at
offsets drawn uniformly (with replacement) from a `torch.Generator` seeded with `seed`, so the
same corpus, tokenizer and seed always give the same batch. The record returned with the batch
holds what a result needs to say which data calibrated it.
"""

from __future__ import annotations

from collections.abc import Sequence
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
    offsets: torch.Tensor | None = None  # (N,) where each window starts in the tokenised corpus


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
    token_ids: torch.Tensor,
    num_sequences: int,
    seqlen: int,
    seed: int,
    *,
    corpus_name: str = "corpus",
    avoid: Sequence[tuple[int, int]] = (),
) -> torch.Tensor:
    """`num_sequences` windows of `seqlen` consecutive tokens at seeded random offsets: (N, T)."""
    return token_ids[window_positions(token_ids, num_sequences, seqlen, seed, corpus_name, avoid)].to(
        torch.long
    )


def window_positions(
    token_ids: torch.Tensor,
    num_sequences: int,
    seqlen: int,
    seed: int,
    corpus_name: str = "corpus",
    avoid: Sequence[tuple[int, int]] = (),
) -> torch.Tensor:
    """The token positions of the windows (N, T): offsets drawn uniformly with replacement among
    those whose window overlaps none of the `avoid` spans (start, length), e.g. another batch's."""
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
    starts = available - seqlen + 1
    if not avoid:
        offsets = torch.randint(0, starts, (num_sequences,), generator=generator)  # (N,)
    else:
        allowed = torch.ones(starts, dtype=torch.bool)  # (starts,)
        for (
            start,
            length,
        ) in avoid:  # a window at o overlaps [start, start + length) iff start - T < o < start + length
            allowed[max(0, start - seqlen + 1) : max(0, min(starts, start + length))] = False
        candidates = torch.nonzero(allowed).flatten()  # (C,)
        if candidates.numel() == 0:
            raise CalibrationError(
                f"calibration corpus {corpus_name!r} has no window of {seqlen} tokens that avoids the "
                "calibration windows: use another corpus or fewer, shorter windows"
            )
        offsets = candidates[torch.randint(0, candidates.numel(), (num_sequences,), generator=generator)]
    positions = offsets[:, None] + torch.arange(seqlen)[None, :]  # (N, T)
    return positions


def build_calibration(
    tokenizer: Any,
    corpus: TextCorpus,
    *,
    num_sequences: int,
    seqlen: int,
    seed: int,
    settings: Settings | None = None,
    requested_seqlen: int | None = None,
    avoid: CalibrationBatch | None = None,
) -> CalibrationBatch:
    """Tokenise `corpus` (cached under the model cache when `settings` is given) and draw the batch.

    `seqlen` is the window length used (already capped at the model's context); `requested_seqlen`
    is what the request asked for, recorded when it differs. With `avoid` (a batch of the same
    corpus), no window overlaps any of its windows: text held out from the calibration.
    """
    token_ids = tokenize_corpus(tokenizer, corpus, settings=settings)  # (tokens,)
    spans = (
        ()
        if avoid is None or avoid.offsets is None or avoid.record.get("data_sha256") != corpus.sha256
        else [(int(o), int(avoid.input_ids.shape[1])) for o in avoid.offsets]
    )
    positions = window_positions(token_ids, num_sequences, seqlen, seed, corpus.name, spans)  # (N, T)
    input_ids = token_ids[positions].to(torch.long)  # (N, T)
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
    if spans:
        record["disjoint_from"] = "the calibration windows"
    offsets = positions[:, 0]
    return CalibrationBatch(input_ids, torch.ones_like(input_ids), record, offsets)
