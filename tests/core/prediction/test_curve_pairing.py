"""A curve's points paired with its middle point where their windows follow it and not the dense
ones, and the windows a pilot projects being the windows stopping then takes."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from statistics import fmean

import pytest

from core.prediction.curve_pairing import choose_reference, middle_point
from core.prediction.paired_windows import estimate, estimate_sequentially, window_order, windows_needed

WINDOWS = 40
SPARSITIES = (0.1, 0.2, 0.3, 0.4, 0.5)


def _dense(seed: int) -> list[float]:
    rng = random.Random(seed)
    return [3.0 + rng.gauss(0.0, 0.4) for _ in range(WINDOWS)]


def _slicing_like(dense: list[float], seed: int) -> dict[float, list[float]]:
    """Each window hurt by its own factor, the same at every sparsity: the points follow one another
    and not the dense windows."""
    rng = random.Random(seed)
    hurt = [rng.lognormvariate(0.0, 0.5) for _ in dense]
    return {
        s: [y + 4.0 * s * h + rng.gauss(0.0, 0.005) for y, h in zip(dense, hurt, strict=True)]
        for s in SPARSITIES
    }


def _mask_like(dense: list[float], seed: int) -> dict[float, list[float]]:
    """Every window scaled alike, with noise of each point's own: the dense windows pair as well."""
    rng = random.Random(seed)
    return {s: [y * (1.0 + s) + rng.gauss(0.0, 0.01) for y in dense] for s in SPARSITIES}


def _look_up(window_nll: list[float]) -> Callable[[Sequence[int]], list[float]]:
    return lambda chosen: [window_nll[i] for i in chosen]


def _pilots(points: dict[float, list[float]], pilot: list[int]) -> dict[float, list[float]]:
    return {s: [nll[i] for i in pilot] for s, nll in points.items()}


def test_the_middle_point_is_the_reference_where_the_points_follow_each_other() -> None:
    dense = _dense(1)
    pilot = window_order(WINDOWS, 3)[:8]
    reference = choose_reference(
        _pilots(_slicing_like(dense, 2), pilot), [dense[i] for i in pilot], WINDOWS, 0.02
    )
    assert reference == 0.3 == middle_point(SPARSITIES)


def test_the_dense_windows_stay_where_they_pair_as_well_at_no_cost() -> None:
    dense = _dense(1)
    pilot = window_order(WINDOWS, 3)[:8]
    points = _pilots(_mask_like(dense, 2), pilot)
    assert choose_reference(points, [dense[i] for i in pilot], WINDOWS, 0.02) is None


@pytest.mark.parametrize("count,pilot_size", [(2, 8), (5, WINDOWS)])
def test_no_reference_for_short_curves_or_a_pilot_of_every_window(count: int, pilot_size: int) -> None:
    dense = _dense(1)
    pilot = window_order(WINDOWS, 3)[:pilot_size]
    points = dict(list(_pilots(_slicing_like(dense, 2), pilot).items())[:count])
    assert choose_reference(points, [dense[i] for i in pilot], WINDOWS, 0.02) is None


@pytest.mark.parametrize("precision", [0.005, 0.01, 0.02])
def test_the_projected_windows_are_on_the_whole_those_stopping_takes(precision: float) -> None:
    """An 8-window pilot reads the spread roughly (its windows needed go as the spread squared), so
    one projection may miss by a few looks; over many orders they land where stopping does."""
    dense = _dense(5)
    points = _slicing_like(dense, 6)
    reference = points[0.3]
    ratios = []
    for s in (0.1, 0.2, 0.4, 0.5):
        truth = points[s]
        for seed in range(30):
            order = window_order(WINDOWS, seed)
            pilot = order[:8]
            projected = windows_needed(
                [truth[i] for i in pilot], [reference[i] for i in pilot], WINDOWS, precision
            )
            taken = estimate_sequentially(_look_up(truth), order, precision, reference)
            ratios.append(projected / taken.windows)
    ratios.sort()
    assert 0.8 <= ratios[len(ratios) // 2] <= 1.25, ratios


def test_the_projection_is_every_window_when_the_precision_is_out_of_reach_and_the_pilot_when_met() -> None:
    dense = _dense(5)
    points = _slicing_like(dense, 6)
    order = window_order(WINDOWS, 0)[:8]
    pilot = [points[0.4][i] for i in order]
    assert windows_needed(pilot, [dense[i] for i in order], WINDOWS, 1e-6) == WINDOWS
    assert windows_needed(pilot, [points[0.4][i] for i in order], WINDOWS, 0.5) == 8  # itself: no residual


def test_a_point_paired_with_a_reference_on_every_window_is_its_full_window_value() -> None:
    dense = _dense(7)
    points = _slicing_like(dense, 8)
    order = window_order(WINDOWS, 1)
    found = estimate(order, [points[0.5][i] for i in order], WINDOWS, points[0.3], paired_with="s=0.3")
    assert found.nll_mean == fmean(points[0.5]) and found.half_log == 0.0
    partial = estimate(
        order[:12], [points[0.5][i] for i in order[:12]], WINDOWS, points[0.3], paired_with="s=0.3"
    )
    assert partial.to_dict(0.02, 1)["paired_with"] == "s=0.3" and partial.half_log > 0.0


def test_a_band_paired_with_the_reference_is_narrower_than_with_the_dense_windows() -> None:
    dense = _dense(9)
    points = _slicing_like(dense, 10)
    order = window_order(WINDOWS, 2)[:10]
    values = [points[0.4][i] for i in order]
    with_dense = estimate(order, values, WINDOWS, dense)
    with_reference = estimate(order, values, WINDOWS, points[0.3])
    assert with_reference.half_log < with_dense.half_log / 3
