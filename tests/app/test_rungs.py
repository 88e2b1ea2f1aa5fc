"""Each rung's estimate from what the store holds: the law rung's one-point band widens with the
distance from its point and covers the caller-point case's truth (or says it cannot); the simulated
rung interpolates in ln PPL and never answers beyond its sparsities; bands never reach below PPL0."""

from __future__ import annotations

import math

import pytest

from app.schemas.predictions import CurvePointPublic
from app.services.prediction.law_values import calibrate
from app.services.prediction.rungs import Evidence, law, simulated
from app.services.prediction.series import caller_series
from app.services.prediction.simulated import SimulatedCurves
from app.services.prediction.simulated_scores import SimulatedScores
from core.prediction.backtests import CALIBRATED, ONE_POINT, Curve, backtest
from core.prediction.rungs import Rung

# SmolLM2-135M sliced, the protocol of issue 32 (64 x 1024 BoolQ seed 7, WikiText-2 1024 x 30)
DENSE = 24.06
TRUTH = {0.15: 71.3, 0.25: 137.0, 0.35: 257.9, 0.45: 444.4}


def one_point_series(at: float = 0.25) -> Evidence:
    points = [(0.0, DENSE, None, None), (at, TRUTH[at], None, None)]
    series = caller_series("m", "slicegpt", "ppl", None, "wikitext2", points)
    return Evidence(series, 0.95, calibrate(series))


def with_record(evidence: Evidence, curves: list[Curve]) -> Evidence:
    scores = {(s.predictor, s.mode): s for s in backtest(curves, level=0.95)}
    return Evidence(evidence.series, evidence.level, evidence.calibration, curves, scores)


def test_a_one_point_law_without_a_record_says_it_cannot_size_its_band() -> None:
    estimate = law(one_point_series(), 0.45)
    assert estimate.rung == Rung.LAW and estimate.value is not None
    assert estimate.band is None and "band_unknown" in estimate.flags


def test_the_one_point_band_widens_with_distance_and_covers_the_caller_point_truth() -> None:
    """The record is the store's one-point backtest of this model's measured curve: each point in
    turn predicts the others. The caller's one point at 0.25 then gets a band that covers 444.4 at
    0.45, where the one-point law says 6,310 (14x off) and its old 3 % band excluded the truth."""
    curve = Curve("smollm2 / slicegpt", "smollm2", "slicegpt", DENSE, tuple(TRUTH.items()))
    evidence = with_record(one_point_series(), [curve])
    assert evidence.score(CALIBRATED, ONE_POINT) is not None
    widths = []
    for s in (0.3, 0.35, 0.45):
        estimate = law(evidence, s)
        assert estimate.band is not None and estimate.value is not None
        low, high = estimate.band
        assert DENSE <= low <= estimate.value <= high
        widths.append(math.log(high / low))
    assert widths == sorted(widths) and widths[0] < widths[-1]
    at_45 = law(evidence, 0.45)
    assert at_45.value is not None and at_45.value > 10 * TRUTH[0.45]  # the law itself is far off
    assert at_45.band is not None and at_45.band[0] <= TRUTH[0.45] <= at_45.band[1]


def simulation(face: dict[float, float], band: float = 0.02) -> SimulatedCurves:
    points = [
        CurvePointPublic(sparsity=s, value=v, low=v * math.exp(-band), high=v * math.exp(band))
        for s, v in sorted(face.items())
    ]
    return SimulatedCurves("job", points, None, "simulated by job", exact=False)


def test_the_simulated_rung_interpolates_in_log_and_stops_at_its_largest_sparsity() -> None:
    series = caller_series("m", "slicegpt", "ppl", None, "wikitext2", [(0.0, DENSE, None, None)])
    evidence = Evidence(series, 0.95, None, simulation=simulation({0.2: 100.0, 0.4: 400.0}))
    at_30 = simulated(evidence, 0.3)
    assert at_30.value == pytest.approx(200.0) and "interpolated" in at_30.flags  # sqrt(100 * 400)
    at_20 = simulated(evidence, 0.2)
    assert at_20.value == pytest.approx(100.0) and "interpolated" not in at_20.flags
    assert at_20.band is not None and DENSE <= at_20.band[0] < 100.0 < at_20.band[1]
    assert "bench record" in at_20.verdict.advice  # no simulation beside a measured curve yet
    beyond = simulated(evidence, 0.5)
    assert beyond.value is None and beyond.why_not is not None and "0.4" in beyond.why_not


def test_a_measured_point_at_a_simulated_sparsity_anchors_the_simulated_curve() -> None:
    points = [(0.0, DENSE, None, None), (0.2, 120.0, None, None)]
    series = caller_series("m", "slicegpt", "ppl", None, "wikitext2", points)
    evidence = Evidence(series, 0.95, None, simulation=simulation({0.2: 100.0, 0.4: 400.0}))
    at_40 = simulated(evidence, 0.4)
    scale = math.log(120.0 / DENSE) / math.log(100.0 / DENSE)  # one anchor: c constant
    assert at_40.value == pytest.approx(DENSE * (400.0 / DENSE) ** scale)
    assert "anchored_on_measured" in at_40.flags


ARC_DENSE = 0.60


def task_evidence(points: list[tuple[float, float, float | None]], *, exact: bool = False) -> Evidence:
    series = caller_series("m", "wanda", "acc", "arc_easy", "arc_easy", [(0.0, ARC_DENSE, 4, 0.25)])
    scores = SimulatedScores("job", tuple(points), exact, "task scores simulated by job")
    return Evidence(series, 0.95, None, simulated_scores=scores)


def test_the_simulated_task_score_answers_with_its_sampling_band_and_says_it_is_unscored() -> None:
    evidence = task_evidence([(0.2, 0.55, 0.02), (0.4, 0.45, 0.03)])
    at_20 = simulated(evidence, 0.2)
    assert at_20.rung == Rung.SIMULATED and at_20.value == pytest.approx(0.55)
    assert at_20.band == pytest.approx((0.55 - 1.959964 * 0.02, 0.55 + 1.959964 * 0.02), abs=1e-6)
    assert "band_sampling_only" in at_20.flags and at_20.verdict.level == "unscored"
    at_30 = simulated(evidence, 0.3)  # linear in s, the wider of the two errors
    assert at_30.value == pytest.approx(0.50) and "interpolated" in at_30.flags
    assert at_30.band == pytest.approx((0.50 - 1.959964 * 0.03, 0.50 + 1.959964 * 0.03), abs=1e-6)
    at_10 = simulated(evidence, 0.1)  # from the dense score
    assert at_10.value == pytest.approx((ARC_DENSE + 0.55) / 2)
    beyond = simulated(evidence, 0.5)
    assert beyond.value is None and beyond.why_not is not None and "0.4" in beyond.why_not


def test_an_exact_simulated_task_score_says_so_and_its_band_stays_within_zero_and_one() -> None:
    estimate = simulated(task_evidence([(0.1, 0.99, 0.02)], exact=True), 0.1)
    assert estimate.verdict.level == "exact" and estimate.band is not None
    assert estimate.band[1] == 1.0 and estimate.band[0] == pytest.approx(0.99 - 1.959964 * 0.02, abs=1e-6)


def test_without_a_simulated_task_score_the_rung_names_the_job() -> None:
    series = caller_series("m", "wanda", "acc", "arc_easy", "arc_easy", [(0.0, ARC_DENSE, 4, 0.25)])
    estimate = simulated(Evidence(series, 0.95, None), 0.2)
    assert estimate.value is None and estimate.why_not is not None and "accuracy" in estimate.why_not
