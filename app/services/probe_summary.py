"""Summaries of probe points: how well the Taylor estimates track the measured deviations.

Pure Python (no numpy): a job stores a few thousand points at most, and the API stays light.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from app.schemas.probes import ProbeSummary
from core.specs.probe import PROBE_KINDS, PROBE_SPACES

MIN_CORRELATION_POINTS = 3
"""Fewer points than this give no correlation: two points always lie on a line."""


class EstimatedPoint(NamedTuple):
    """What the summary reads of a probe point that has an estimate."""

    probe: str
    sublayer: str | None
    space: str
    metric: str
    value: float
    estimate: float
    decoding_step: bool = False  # a counterfactual point measured at a decoding step, not on a prompt
    convention: str = "prunecast"  # points read by different conventions are never pooled


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Pearson's r of two equally long sequences; None with fewer than 3 pairs, when either sequence
    does not vary, or when the sums overflow."""
    n = len(xs)
    if n != len(ys):
        raise ValueError(f"pearson needs equally long sequences ({n} and {len(ys)})")
    if n < MIN_CORRELATION_POINTS:
        return None
    mean_x, mean_y = math.fsum(xs) / n, math.fsum(ys) / n
    dx = [x - mean_x for x in xs]
    dy = [y - mean_y for y in ys]
    sxx = math.fsum(d * d for d in dx)
    syy = math.fsum(d * d for d in dy)
    sxy = math.fsum(a * b for a, b in zip(dx, dy, strict=True))
    if sxx == 0.0 or syy == 0.0:
        return None
    r = sxy / math.sqrt(sxx) / math.sqrt(syy)
    return max(-1.0, min(1.0, r)) if math.isfinite(r) else None


_Key = tuple[str, str, bool, str | None, str, str]


def _order(key: _Key) -> tuple[str, int, bool, str, int, str, str]:
    convention, probe, stepped, sublayer, space, metric = key
    probe_rank = PROBE_KINDS.index(probe) if probe in PROBE_KINDS else len(PROBE_KINDS)
    space_rank = PROBE_SPACES.index(space) if space in PROBE_SPACES else len(PROBE_SPACES)
    return convention, probe_rank, stepped, sublayer or "", space_rank, space, metric


def summarize(points: Iterable[EstimatedPoint]) -> list[ProbeSummary]:
    """Per (convention, probe, prompt or decoding-step points, sublayer, space, metric): n, Pearson r
    of estimate against value, the means, and the mean relative error |estimate - value| / |value|
    (over values != 0). Non-finite points are left out."""
    groups: dict[_Key, list[EstimatedPoint]] = {}
    for point in points:
        if math.isfinite(point.value) and math.isfinite(point.estimate):
            key = (
                point.convention,
                point.probe,
                point.decoding_step,
                point.sublayer,
                point.space,
                point.metric,
            )
            groups.setdefault(key, []).append(point)
    summaries = []
    for key in sorted(groups, key=_order):
        group = groups[key]
        values = [p.value for p in group]
        estimates = [p.estimate for p in group]
        relative = [abs(p.estimate - p.value) / abs(p.value) for p in group if p.value != 0.0]
        summaries.append(
            ProbeSummary(
                convention=key[0],
                probe=key[1],
                decoding_steps=key[2],
                sublayer=key[3],
                space=key[4],
                metric=key[5],
                n=len(group),
                correlation=pearson(estimates, values),
                mean_value=math.fsum(values) / len(group),
                mean_estimate=math.fsum(estimates) / len(group),
                mean_relative_error=math.fsum(relative) / len(relative) if relative else None,
            )
        )
    return summaries
