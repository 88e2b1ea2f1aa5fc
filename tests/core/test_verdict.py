"""A prediction's verdict is read off the backtest record it was chosen by."""

from __future__ import annotations

import pytest

from core.backtests import ZERO_MODEL, HeldOut, Score, verdict


def _record(apes: list[float], covered: bool = True) -> Score:
    """Held-out points measured at 100 and predicted off by each APE, inside their band or not."""
    band = (0.0, 1e9) if covered else (0.0, 1.0)
    points = tuple(
        HeldOut("a curve", 0.1 * (i + 1), 100.0, 100.0 * (1 + ape), band, "other models")
        for i, ape in enumerate(apes)
    )
    return Score("feature law: x", ZERO_MODEL, 0.95, points)


@pytest.mark.parametrize(
    ("apes", "level"),
    [
        ([0.05, 0.10, 0.15], "reliable"),
        ([0.10, 0.30, 0.40], "rough"),
        ([0.50, 0.50, 0.51], "unreliable"),
        ([1.9, 3.05, 2.0], "unreliable"),
    ],
)
def test_the_verdict_follows_the_backtest_mape(apes: list[float], level: str) -> None:
    result = verdict(_record(apes), minimum_points=3)
    assert result.level == level
    assert f"{sum(apes) / len(apes):.1%}" in result.advice and "band coverage 100%" in result.advice


def test_an_unreliable_verdict_says_to_measure_and_reports_the_band_misses() -> None:
    result = verdict(_record([2.0, 2.0, 2.0], covered=False), minimum_points=3)
    assert result.level == "unreliable"
    assert "measure" in result.advice and "band coverage 0%" in result.advice


@pytest.mark.parametrize("score", [None, _record([0.01, 0.01])])
def test_no_record_or_too_few_points_is_unscored(score: Score | None) -> None:
    assert verdict(score, minimum_points=3).level == "unscored"
