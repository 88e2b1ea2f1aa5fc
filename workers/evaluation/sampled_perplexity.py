"""Perplexity to a precision: windows scored in a seeded order until the band is narrow enough.

The protocol and its windows are `workers.evaluation.perplexity`'s; which windows, the estimator and
the band are `core.prediction.paired_windows`'. A pruned model is paired with its dense model's
per-window NLL (stored with the dense baseline), a dense model is estimated unpaired.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from core.prediction.paired_windows import WindowEstimate, WindowScorer, estimate_sequentially, window_order
from workers.evaluation.perplexity import PerplexityResult, evaluation_windows, window_nll_sums


def perplexity_to_precision(
    model: torch.nn.Module,
    token_ids: torch.Tensor,
    *,
    seqlen: int,
    precision: float,
    order_seed: int,
    dense_window_nll: Sequence[float] | None = None,
    max_windows: int | None = None,
    batch_size: int = 1,
    progress: Callable[[WindowEstimate], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> PerplexityResult:
    """The protocol's perplexity (`perplexity`'s windows) estimated from as few windows, drawn in the
    order `window_order(W, order_seed)`, as reach `precision`; paired with `dense_window_nll` (every
    window's dense mean NLL, in window order) when given. `progress` runs after each look at the band.
    ValueError when the dense windows are not the protocol's."""
    if token_ids.dim() != 1:
        raise ValueError(f"token_ids must be 1-D, got shape {tuple(token_ids.shape)}")
    windows = evaluation_windows(token_ids, seqlen, max_windows)  # (W, T)
    population = windows.shape[0]
    if dense_window_nll is not None and len(dense_window_nll) != population:
        raise ValueError(
            f"the dense baseline scored {len(dense_window_nll)} windows, this protocol has {population}"
        )
    started = time.perf_counter()
    found = estimate_sequentially(
        window_scorer(model, windows, batch_size=batch_size, should_stop=should_stop),
        window_order(population, order_seed),
        precision,
        dense_window_nll,
        progress=progress,
    )
    return PerplexityResult(
        ppl=found.ppl,
        nll_mean=found.nll_mean,
        windows=found.windows,
        tokens_scored=found.windows * (seqlen - 1),
        seqlen=seqlen,
        max_windows=max_windows,
        elapsed_s=time.perf_counter() - started,
        window_nll=found.window_nll,
        sampling=found,
    )


def window_scorer(
    model: torch.nn.Module,
    windows: torch.Tensor,
    *,
    batch_size: int = 1,
    should_stop: Callable[[], bool] | None = None,
) -> WindowScorer:
    """Scores windows of `windows` (W, T) by index on `model` as it is when called: their mean NLL."""
    tokens = windows.shape[1] - 1

    def score(indices: Sequence[int]) -> list[float]:
        chosen = windows[torch.tensor(list(indices), dtype=torch.long)]
        sums = window_nll_sums(model, chosen, batch_size=batch_size, should_stop=should_stop)
        return [window_sum.item() / tokens for window_sum in sums]

    return score
