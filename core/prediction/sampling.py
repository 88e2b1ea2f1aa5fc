"""A perplexity measured on some of a split's windows, as a band for the value over all of them.

The windows a simulation scores are treated as a sample of the split's windows: ln PPL is the mean of
the windows' mean NLL (every window has the same number of scored tokens), its standard error the
windows' spread over sqrt(n) with the finite-population correction sqrt(1 - n / N), and the band uses
Student's t with n - 1 degrees of freedom (a normal quantile from 4 windows covered 89 % of the
points it claimed 95 % of: bench/README.md, "simulate_curves.py").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist, fmean, stdev


def t_quantile(probability: float, df: int) -> float:
    """Student's t quantile by the Cornish-Fisher expansion in 1/df (Abramowitz & Stegun 26.7.5, five
    terms): within 0.003 of the exact value for df >= 3 at the usual levels, exact as df grows."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, got {df}")
    z = NormalDist().inv_cdf(probability)
    terms = (
        (z**3 + z) / 4,
        (5 * z**5 + 16 * z**3 + 3 * z) / 96,
        (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
        (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160,
    )
    return z + sum(term / df ** (power + 1) for power, term in enumerate(terms))


@dataclass(frozen=True)
class SampledBand:
    """The band for the whole split's perplexity from `windows` of its `of_windows` windows."""

    level: float
    low: float
    high: float
    stderr_log: float  # standard error of ln PPL
    windows: int
    of_windows: int


def sampled_band(window_nll: Sequence[float], population: int, level: float = 0.95) -> SampledBand | None:
    """`window_nll`: each scored window's mean next-token NLL; `population`: the split's windows. None
    when every window was scored (nothing to cover) or only one (no spread to read)."""
    count = len(window_nll)
    if count < 2 or count >= population:
        return None
    centre = fmean(window_nll)
    stderr = stdev(window_nll) / math.sqrt(count) * math.sqrt(1.0 - count / population)
    half = t_quantile(0.5 + level / 2.0, count - 1) * stderr
    return SampledBand(
        level=level,
        low=math.exp(centre - half),
        high=math.exp(centre + half),
        stderr_log=stderr,
        windows=count,
        of_windows=population,
    )
