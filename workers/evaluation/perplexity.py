"""Token perplexity by the SliceGPT/Wanda protocol, so dense and pruned numbers compare fairly.

The corpus is tokenised once and cut into non-overlapping windows of `seqlen` tokens; the
remainder is dropped. Each window is scored on its own (no context carried over): seqlen - 1
next-token predictions per window, NLL summed in float64, PPL = exp(mean NLL). Results depend
on seqlen and on the windows scored, so both travel with every result.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from core.prediction.paired_windows import WindowEstimate


class EvaluationStopped(Exception):
    """`should_stop` asked to end the evaluation early (job cancelled or lease lost)."""


@dataclass(frozen=True)
class PerplexityResult:
    """A perplexity with the protocol parameters needed to reproduce or compare it."""

    ppl: float
    nll_mean: float  # mean next-token negative log-likelihood in nats
    windows: int  # windows scored
    tokens_scored: int  # windows * (seqlen - 1)
    seqlen: int
    max_windows: int | None  # the cap asked for; None means every full window
    elapsed_s: float
    window_nll: tuple[float, ...] = ()  # each scored window's mean NLL, in the order scored
    sampling: WindowEstimate | None = None  # scored on part of the windows: how, and the band


def effective_seqlen(model: torch.nn.Module, requested: int) -> int:
    """The window length actually used: `requested`, capped at the model's context length."""
    if requested < 2:
        raise ValueError(f"seqlen must be at least 2 (one prediction per window), got {requested}")
    config = getattr(model, "config", None)
    for attribute in ("max_position_embeddings", "n_positions"):
        limit = getattr(config, attribute, None)
        if isinstance(limit, int) and limit > 0:
            return min(requested, limit)
    return requested


def evaluation_windows(token_ids: torch.Tensor, seqlen: int, max_windows: int | None) -> torch.Tensor:
    """The protocol's windows: the first `max_windows` (all: None) non-overlapping windows of `seqlen`
    tokens of `token_ids` (1-D), the remainder dropped: (W, T) long. ValueError without a whole window."""
    available = token_ids.numel() // seqlen
    if available == 0:
        raise ValueError(
            f"need at least one window of {seqlen} tokens, got {token_ids.numel()}; use a smaller seqlen"
        )
    total = available if max_windows is None else min(available, max_windows)
    return token_ids[: total * seqlen].to(torch.long).view(total, seqlen)


def perplexity(
    model: torch.nn.Module,
    token_ids: torch.Tensor,
    *,
    seqlen: int,
    max_windows: int | None = None,
    batch_size: int = 1,
    progress: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> PerplexityResult:
    """Perplexity of a Hugging Face-style causal LM over non-overlapping windows of `token_ids`.

    `seqlen` is used as given (call `effective_seqlen` first to respect the context length).
    `progress(done, total)` runs after each batch; `should_stop()` runs before each batch and
    ends the evaluation with EvaluationStopped when it returns True.
    """
    if token_ids.dim() != 1:
        raise ValueError(f"token_ids must be 1-D, got shape {tuple(token_ids.shape)}")
    if seqlen < 2:
        raise ValueError(f"seqlen must be at least 2 (one prediction per window), got {seqlen}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if max_windows is not None and max_windows < 1:
        raise ValueError(f"max_windows must be at least 1 or None, got {max_windows}")
    windows = evaluation_windows(token_ids, seqlen, max_windows)  # (W, T)
    total = windows.shape[0]
    started = time.perf_counter()
    sums = window_nll_sums(model, windows, batch_size=batch_size, progress=progress, should_stop=should_stop)
    nll_sum = torch.zeros((), dtype=torch.float64)
    for window_sum in sums:  # in window order, as one running float64 sum
        nll_sum += window_sum
    tokens_scored = total * (seqlen - 1)
    nll_mean = nll_sum.item() / tokens_scored
    return PerplexityResult(
        ppl=math.exp(nll_mean),
        nll_mean=nll_mean,
        windows=total,
        tokens_scored=tokens_scored,
        seqlen=seqlen,
        max_windows=max_windows,
        elapsed_s=time.perf_counter() - started,
        window_nll=tuple(window_sum.item() / (seqlen - 1) for window_sum in sums),
    )


def window_nll_sums(
    model: torch.nn.Module,
    windows: torch.Tensor,
    *,
    batch_size: int = 1,
    progress: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> list[torch.Tensor]:
    """Each window's summed next-token NLL (a float64 scalar on the CPU) for `windows` (W, T), scored on
    its own. `progress(done, W)` after each batch; EvaluationStopped when `should_stop()` says."""
    total = windows.shape[0]
    device = next(model.parameters()).device
    sums: list[torch.Tensor] = []
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for start in range(0, total, batch_size):
                if should_stop is not None and should_stop():
                    raise EvaluationStopped(f"stopped after {start} of {total} windows")
                batch = windows[start : start + batch_size].to(device)  # (B, T)
                logits = model(input_ids=batch, use_cache=False).logits  # (B, T, V)
                for row in range(batch.size(0)):  # one window at a time keeps the fp32 copy small
                    predictions = logits[row, :-1, :].float()  # (T-1, V): position t predicts t+1
                    targets = batch[row, 1:]  # (T-1,)
                    token_nll = F.cross_entropy(predictions, targets, reduction="none")  # (T-1,)
                    sums.append(token_nll.double().sum().cpu())
                if progress is not None:
                    progress(min(start + batch_size, total), total)
    finally:
        model.train(was_training)
    return sums
