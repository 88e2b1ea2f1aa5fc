"""The paired-window estimator: exact with every window, a band that covers the full-window value as
often as it claims, and stopping that obeys the precision asked for."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence
from statistics import fmean

import pytest

from core.prediction.paired_windows import (
    ESTIMATORS,
    estimate,
    estimate_sequentially,
    window_order,
)


def _population(
    count: int, seed: int, slope: float = 1.3, noise: float = 0.05
) -> tuple[list[float], list[float]]:
    """Dense and pruned per-window mean NLL: the pruned follows the dense with some noise of its own."""
    rng = random.Random(seed)
    dense = [3.0 + rng.gauss(0.0, 0.4) for _ in range(count)]
    pruned = [0.5 + slope * y + rng.gauss(0.0, noise) for y in dense]
    return dense, pruned


@pytest.mark.parametrize("estimator", sorted(ESTIMATORS))
def test_every_window_gives_the_full_window_value_exactly_and_no_band(estimator: str) -> None:
    dense, pruned = _population(40, seed=1)
    order = window_order(40, seed=7)
    found = estimate(order, [pruned[i] for i in order], 40, dense, estimator=estimator)
    assert found.nll_mean == fmean(pruned)  # fmean sums exactly: the order does not matter
    assert found.half_log == 0.0 and found.low == found.high == found.ppl and found.complete


def test_the_finite_population_correction_shrinks_the_band_to_nothing_as_windows_run_out() -> None:
    dense, pruned = _population(40, seed=2)
    order = window_order(40, seed=3)
    widths = [
        estimate(order[:n], [pruned[i] for i in order[:n]], 40, dense).half_log for n in (8, 20, 36, 39)
    ]
    assert widths[0] > widths[1] > widths[2] > widths[3] > 0.0
    # at n = N - 1 the correction is sqrt(1 / N) of the residuals' spread over sqrt(n)
    chosen = order[:39]
    found = estimate(chosen, [pruned[i] for i in chosen], 40, dense, estimator="difference")
    gaps = [pruned[i] - dense[i] for i in chosen]
    spread = math.sqrt(sum((g - fmean(gaps)) ** 2 for g in gaps) / 38)
    assert found.stderr_log == pytest.approx(spread / math.sqrt(39) * math.sqrt(1 / 40), rel=1e-12)


def test_the_difference_estimator_is_the_dense_mean_plus_the_mean_gap_with_a_t_band() -> None:
    dense = [2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    pruned = [2.5, 3.4, 4.6, 5.5, 6.4, 7.6]
    chosen = [0, 2, 4, 5]
    found = estimate(chosen, [pruned[i] for i in chosen], 6, dense, estimator="difference")
    gaps = [pruned[i] - dense[i] for i in chosen]
    assert found.nll_mean == pytest.approx(fmean(dense) + fmean(gaps), abs=1e-12)
    spread = math.sqrt(sum((g - fmean(gaps)) ** 2 for g in gaps) / 3)
    stderr = spread / 2 * math.sqrt(1 - 4 / 6)
    assert found.stderr_log == pytest.approx(stderr, rel=1e-12)
    assert found.half_log == pytest.approx(3.182 * stderr, rel=2e-3)  # t(0.975, 3) = 3.182


@pytest.mark.parametrize(
    ("estimator", "pruned_of"),
    [
        ("difference", lambda y: y + 0.7),
        ("ratio", lambda y: 1.4 * y),
        ("regression", lambda y: 0.3 + 1.4 * y),
    ],
)
def test_each_estimator_is_exact_where_the_damage_has_its_shape(estimator: str, pruned_of: object) -> None:
    dense, _ = _population(30, seed=4)
    pruned = [pruned_of(y) for y in dense]  # type: ignore[operator]
    chosen = window_order(30, seed=5)[:8]
    found = estimate(chosen, [pruned[i] for i in chosen], 30, dense, estimator=estimator)
    assert found.nll_mean == pytest.approx(fmean(pruned), abs=1e-12)
    assert found.half_log == pytest.approx(0.0, abs=1e-9)


def test_a_seeded_order_is_reproducible_and_a_permutation() -> None:
    assert window_order(50, seed=11) == window_order(50, seed=11)
    assert sorted(window_order(50, seed=11)) == list(range(50))
    assert window_order(50, seed=11) != window_order(50, seed=12)


@pytest.mark.parametrize("estimator", ["difference", "ratio", "regression", "unpaired"])
def test_the_band_covers_the_full_window_value_as_often_as_it_claims(estimator: str) -> None:
    dense, pruned = _population(60, seed=6, slope=1.2, noise=0.08)
    truth = fmean(pruned)
    covered, draws = 0, 800
    for seed in range(draws):
        chosen = window_order(60, seed)[:12]
        found = estimate(
            chosen,
            [pruned[i] for i in chosen],
            60,
            dense if estimator != "unpaired" else None,
            estimator=estimator,
        )
        covered += abs(found.nll_mean - truth) <= found.half_log
    assert 0.91 <= covered / draws <= 0.99


def test_pairing_narrows_the_band_where_the_pruned_windows_follow_the_dense_ones() -> None:
    dense, pruned = _population(60, seed=8)
    chosen = window_order(60, seed=9)[:12]
    values = [pruned[i] for i in chosen]
    paired = estimate(chosen, values, 60, dense)
    unpaired = estimate(chosen, values, 60, None)
    assert unpaired.estimator == "unpaired" and paired.half_log < unpaired.half_log / 3


class _Scorer:
    def __init__(self, values: Sequence[float]) -> None:
        self.values = values
        self.asked: list[int] = []

    def __call__(self, indices: Sequence[int]) -> list[float]:
        self.asked += indices
        return [self.values[i] for i in indices]


@pytest.mark.parametrize("precision", [0.002, 0.005, 0.01, 0.05])
def test_stopping_obeys_the_precision_and_scores_each_window_once_in_order(precision: float) -> None:
    dense, pruned = _population(80, seed=10, noise=0.1)
    order = window_order(80, seed=42)
    scorer = _Scorer(pruned)
    looks: list[int] = []
    found = estimate_sequentially(scorer, order, precision, dense, progress=lambda e: looks.append(e.windows))
    assert scorer.asked == order[: found.windows]
    assert found.relative_half_width <= precision or found.complete
    assert looks[0] == 8 and all(b - a == 4 for a, b in itertools.pairwise(looks) if b != 80)
    for earlier in looks[:-1]:  # no earlier look reached it
        chosen = order[:earlier]
        assert estimate(chosen, [pruned[i] for i in chosen], 80, dense).relative_half_width > precision


def test_windows_already_scored_are_used_and_not_scored_again() -> None:
    dense, pruned = _population(40, seed=12, noise=0.2)
    order = window_order(40, seed=1)
    scorer = _Scorer(pruned)
    pilot = [pruned[i] for i in order[:8]]
    found = estimate_sequentially(scorer, order, 0.001, dense, scored=pilot)
    assert found.complete and scorer.asked == order[8:]
    assert found.nll_mean == pytest.approx(fmean(pruned), abs=1e-14)


@pytest.mark.parametrize("precision", [0.0, 1.0, -0.1, 2.0])
def test_a_precision_outside_zero_one_is_refused(precision: float) -> None:
    with pytest.raises(ValueError, match="precision"):
        estimate_sequentially(_Scorer([1.0] * 10), list(range(10)), precision, None)
