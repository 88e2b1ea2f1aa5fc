"""The band for a whole split from some of its windows: Student's t, finite-population corrected."""

from __future__ import annotations

import math
import random

import pytest

from core.prediction.sampling import sampled_band, t_quantile

# Two-sided 95 % quantiles of Student's t (tables).
T_975 = {3: 3.182, 5: 2.571, 10: 2.228, 30: 2.042}


@pytest.mark.parametrize(("df", "expected"), sorted(T_975.items()))
def test_t_quantile_matches_the_tables(df: int, expected: float) -> None:
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=0.004)


def test_the_band_is_centred_on_the_scored_windows_and_narrows_to_nothing_with_the_whole_split() -> None:
    windows = [3.0, 3.2, 2.9, 3.5]
    band = sampled_band(windows, population=16)
    assert band is not None
    centre = sum(windows) / 4
    assert math.sqrt(band.low * band.high) == pytest.approx(math.exp(centre))
    assert band.stderr_log == pytest.approx(0.2646 / 2 * math.sqrt(12 / 16), rel=1e-3)
    assert sampled_band(windows, population=4) is None and sampled_band(windows[:1], population=16) is None
    wider = sampled_band(windows, population=10_000)
    assert wider is not None and wider.high > band.high


def test_the_band_covers_the_split_at_about_its_level() -> None:
    """Sampling 4 of 16 normal windows many times: the t band covers the split's mean about 95 % of the
    time (a normal quantile would cover about 89 %)."""
    generator = random.Random(0)
    covered = trials = 0
    for _ in range(2000):
        split = [generator.gauss(3.0, 0.3) for _ in range(16)]
        scored = generator.sample(split, 4)
        band = sampled_band(scored, population=16)
        assert band is not None
        covered += band.low <= math.exp(sum(split) / 16) <= band.high
        trials += 1
    assert 0.93 <= covered / trials <= 0.995
