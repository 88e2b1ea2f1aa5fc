"""Log-normal bands: perplexity errors are multiplicative (a prediction 2x too high is as wrong as one
2x too low), so a band is symmetric in ln PPL; it never reaches below the dense perplexity, which no
pruning improves on."""

from __future__ import annotations

import math
from statistics import NormalDist


def z_value(level: float) -> float:
    """The two-sided standard-normal quantile of a band at `level`."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    return NormalDist().inv_cdf(0.5 + level / 2.0)


def log_sd_of_band(value: float, band: tuple[float, float], level: float) -> float:
    """The sd of ln(value) a symmetric log-normal band at `level` states (its wider half)."""
    low, high = band
    if not (value > 0.0 and low > 0.0 and high > 0.0):
        raise ValueError("a log-normal band needs positive values")
    return max(math.log(high / value), math.log(value / low)) / z_value(level)


def combined_sd(*sds: float | None) -> float | None:
    """Independent log errors add in variance; None when none is known."""
    known = [sd for sd in sds if sd is not None]
    return math.sqrt(math.fsum(sd * sd for sd in known)) if known else None


def lognormal_band(
    value: float, log_sd: float, level: float, *, floor: float | None = None
) -> tuple[float, float]:
    """[value e^(-z sd), value e^(z sd)], its low end raised to `floor` (the dense perplexity) where it
    would fall below it, never above the value itself (a simulation of a random model can sit a hair
    below its dense value); an overflowing high end is infinity."""
    if not (math.isfinite(log_sd) and log_sd >= 0.0):
        raise ValueError(f"log sd must be finite and >= 0, got {log_sd}")
    spread = z_value(level) * log_sd
    low = value * math.exp(-spread)
    try:
        high = value * math.exp(spread)
    except OverflowError:
        high = math.inf
    if floor is not None:
        low = max(low, min(floor, value))
    return low, high
