"""What the probes store: one `ProbeRecord` per probe point, and the running means behind them.

Means are over tokens; over several prompts they are token-weighted (every token counts once),
which is the mean over prompts weighted by their token counts. Each point also keeps its spread over
the same tokens: the count, the smallest and largest value, and the standard error of the mean
(sample sd / sqrt(n), as if the tokens were independent; tokens of one prompt are not, so read it as
a lower bound of the uncertainty).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from workers.probing.deviation import TokenDeviation

ProgressCallback = Callable[[int, int], None]  # (done, total), after each layer or step
StopCheck = Callable[[], bool]  # True asks the probe to stop between layers or steps


class ProbeStopped(RuntimeError):
    """should_stop() returned True between two layers or steps."""


@dataclass(frozen=True)
class ProbeRecord:
    """One stored probe point."""

    probe: str  # "counterfactual" | "model" | "generation-greedy" | "generation-sampled" | "mc-subspace"
    layer: int | None  # dense layer index (0-based), or None
    sublayer: str | None  # "attention" | "mlp" | "block" for counterfactual; None otherwise
    space: str  # "embedding" | "logits" | "probs" | "options" | "tokens"
    step: int | None  # generation step (0-based), or None
    metric: str  # "1-cos" | "dpar" | "dperp" | "kl" | "agree" | "prefix_agree" | "argmax_agree"
    value: float  # exact value, mean over tokens (and prompts)
    estimate: float | None  # Taylor estimate, mean over the same tokens, where one exists
    n: int | None = None  # tokens (or prompts) the mean is over
    stderr: float | None = None  # sample sd / sqrt(n) of the values; None below two
    value_min: float | None = None  # smallest value over those tokens
    value_max: float | None = None  # largest


_Key = tuple[str, int | None, str | None, str, int | None, str]


class RecordSums:
    """Token sums per probe point, turned into token-weighted means by `records()`."""

    def __init__(self, probe: str) -> None:
        self.probe = probe
        # key -> [sum of values, sum of estimates, tokens, sum of squared values, min, max]
        self._sums: dict[_Key, list[float]] = {}
        self._has_estimate: dict[_Key, bool] = {}

    def add(
        self,
        space: str,
        metric: str,
        values: torch.Tensor,
        estimates: torch.Tensor | None = None,
        *,
        layer: int | None = None,
        sublayer: str | None = None,
        step: int | None = None,
    ) -> None:
        """Add per-token values (and estimates) of one metric."""
        key: _Key = (self.probe, layer, sublayer, space, step, metric)
        sums = self._sums.setdefault(key, [0.0, 0.0, 0.0, 0.0, math.inf, -math.inf])
        flat = values.double().flatten()
        sums[0] += float(flat.sum())
        if estimates is not None:
            sums[1] += float(estimates.double().sum())
        sums[2] += flat.numel()
        if flat.numel():
            sums[3] += float(flat.square().sum())
            sums[4] = min(sums[4], float(flat.min()))
            sums[5] = max(sums[5], float(flat.max()))
        self._has_estimate[key] = estimates is not None

    def add_deviations(
        self,
        space: str,
        deviations: list[TokenDeviation],
        *,
        layer: int | None = None,
        sublayer: str | None = None,
        step: int | None = None,
        metrics: tuple[str, ...] | None = None,
    ) -> None:
        """Add each deviation (only those named in `metrics`, when given)."""
        for deviation in deviations:
            if metrics is None or deviation.metric in metrics:
                self.add(
                    space,
                    deviation.metric,
                    deviation.values,
                    deviation.estimates,
                    layer=layer,
                    sublayer=sublayer,
                    step=step,
                )

    def records(self) -> list[ProbeRecord]:
        """Token-weighted means, in the order the points were first added; empty points left out."""
        out = []
        for key, (value, estimate, count, squares, smallest, largest) in self._sums.items():
            if count == 0:
                continue
            probe, layer, sublayer, space, step, metric = key
            mean = value / count
            variance = max(squares - count * mean * mean, 0.0) / (count - 1) if count > 1 else None
            out.append(
                ProbeRecord(
                    probe=probe,
                    layer=layer,
                    sublayer=sublayer,
                    space=space,
                    step=step,
                    metric=metric,
                    value=mean,
                    estimate=estimate / count if self._has_estimate[key] else None,
                    n=int(count),
                    stderr=None if variance is None else math.sqrt(variance / count),
                    value_min=smallest,
                    value_max=largest,
                )
            )
        return out
