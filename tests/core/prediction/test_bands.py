"""Log-normal bands: symmetric in ln PPL, and never below the dense perplexity."""

from __future__ import annotations

import math

import pytest

from core.prediction.bands import combined_sd, log_sd_of_band, lognormal_band, z_value


def test_a_band_is_symmetric_in_log_and_reads_back_its_sd() -> None:
    low, high = lognormal_band(100.0, 0.2, 0.95)
    assert (
        math.log(high / 100.0) == pytest.approx(math.log(100.0 / low)) == pytest.approx(z_value(0.95) * 0.2)
    )
    assert log_sd_of_band(100.0, (low, high), 0.95) == pytest.approx(0.2)


@pytest.mark.parametrize("sd", [0.01, 0.5, 3.0, 30.0])
def test_a_band_never_drops_below_the_dense_perplexity(sd: float) -> None:
    low, high = lognormal_band(30.0, sd, 0.99, floor=25.0)
    assert low >= 25.0 and high >= 30.0


def test_independent_errors_add_in_variance() -> None:
    assert combined_sd(0.3, 0.4) == pytest.approx(0.5)
    assert combined_sd(None, 0.4) == pytest.approx(0.4)
    assert combined_sd(None, None) is None
