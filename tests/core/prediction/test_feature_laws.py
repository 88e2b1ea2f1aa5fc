"""Feature laws and their backtests: recover what generated the points, and bands that cover as
often as they say."""

from __future__ import annotations

import math
import random

import pytest

from core.prediction import feature_laws
from core.prediction.backtests import (
    CALIBRATED,
    FACE_VALUE,
    LOSO,
    ONE_POINT,
    STRICT,
    ZERO_CURVE,
    ZERO_MODEL,
    Curve,
    backtest,
)
from core.prediction.laws import calibrate_ppl, strict_ppl
from core.profiles import FEATURES, LensMeans, SignalSpectrum, feature_value, lens_value

SPARSITIES = (0.1, 0.2, 0.3, 0.4, 0.5)


def test_a_law_fitted_on_its_own_points_recovers_its_coefficient() -> None:
    c = 2.7
    points = [(f, c * f) for f in (0.05, 0.1, 0.2, 0.4)]
    fit = feature_laws.fit_curve(points)
    assert fit.c == pytest.approx(c, rel=1e-12)
    assert fit.residual_sq == pytest.approx(0.0, abs=1e-20)


def test_a_power_law_fitted_on_its_own_points_recovers_its_exponent() -> None:
    points = [(f, 2.0 * f**0.6) for f in (0.003, 0.01, 0.03, 0.1)]
    exponent = feature_laws.fit_exponent(points)
    assert exponent == pytest.approx(0.6, rel=1e-9)
    powered = [(f**exponent, y) for f, y in points]
    assert feature_laws.fit_curve(powered).c == pytest.approx(2.0, rel=1e-9)
    assert feature_laws.fit_exponent([(0.1, 1.0)]) is None  # one point cannot give a slope


def test_a_noisy_fit_lands_within_its_standard_error() -> None:
    rng = random.Random(0)
    c, sigma = 1.5, 0.03
    misses = 0
    for _ in range(400):
        points = [(f, c * f + rng.gauss(0.0, sigma)) for f in (0.1, 0.2, 0.3, 0.4, 0.5)]
        fit = feature_laws.fit_curve(points)
        misses += abs(fit.c - c) > 1.96 * fit.se
    assert misses / 400 < 0.10  # about 5 % for a well-calibrated standard error


def test_one_point_moves_the_posterior_toward_it_by_its_precision() -> None:
    prior = feature_laws.Coefficient(1.0, 0.5, 0.03, "test")
    updated = feature_laws.posterior(prior, [(0.5, 2.0 * 0.5)])  # the point says c = 2
    assert 1.9 < updated.value < 2.0  # the point (sd 0.06 in c) outweighs the prior (sd 0.5)
    assert updated.sd < prior.sd
    assert feature_laws.posterior(prior, [(0.0, 0.3)]) == prior  # F = 0 says nothing about c


def test_prediction_band_is_symmetric_in_log_space() -> None:
    prediction = feature_laws.predict(20.0, 0.4, feature_laws.Coefficient(2.0, 0.25, 0.03, "test"))
    assert prediction.value == pytest.approx(20.0 * math.exp(0.8))
    lo, hi = prediction.band
    assert math.log(hi / prediction.value) == pytest.approx(math.log(prediction.value / lo))
    assert prediction.log_sd == pytest.approx(math.hypot(0.4 * 0.25, 0.03))


def _synthetic_curves(
    n: int, mean: float, spread: float, sigma: float, seed: int, exponent: float = 1.0
) -> list[Curve]:
    """Curves of a correctly specified model: c_m ~ N(mean, (spread mean)^2), ln PPL - ln PPL0 =
    c_m F^exponent plus noise of sd sigma."""
    rng = random.Random(seed)
    curves = []
    for m in range(n):
        c = rng.gauss(mean, spread * mean)
        features = tuple(0.2 * s + 0.8 * s * s for s in SPARSITIES)
        noisy = [c * f**exponent + rng.gauss(0.0, sigma) for f in features]
        points = tuple((s, 25.0 * math.exp(y)) for s, y in zip(SPARSITIES, noisy, strict=True))
        curves.append(Curve(f"model-{m}", f"model-{m}", "slicegpt", 25.0, points, {"energy-mean": features}))
    return curves


def test_backtest_bands_of_a_correctly_specified_model_cover_near_their_level() -> None:
    curves = _synthetic_curves(80, mean=3.0, spread=0.3, sigma=0.03, seed=1)
    scores = {(s.predictor, s.mode): s for s in backtest(curves)}
    for mode in (ZERO_CURVE, ZERO_MODEL, ONE_POINT):
        score = scores[("feature law: energy-mean", mode)]
        assert score.coverage is not None
        assert 0.88 <= score.coverage <= 0.99, (mode, score.coverage)
    # With one point the band narrows and the error falls, as it should.
    zero, one = (
        scores[("feature law: energy-mean", ZERO_MODEL)],
        scores[("feature law: energy-mean", ONE_POINT)],
    )
    assert one.mape is not None and zero.mape is not None and one.mape < zero.mape


def test_power_law_backtest_of_power_law_curves_covers_near_its_level_and_beats_the_linear_law() -> None:
    curves = _synthetic_curves(60, mean=3.0, spread=0.2, sigma=0.03, seed=2, exponent=0.6)
    scores = {(s.predictor, s.mode): s for s in backtest(curves)}
    power, linear = (
        scores[("power law: energy-mean", ZERO_CURVE)],
        scores[("feature law: energy-mean", ZERO_CURVE)],
    )
    assert power.coverage is not None and 0.88 <= power.coverage <= 0.99, power.coverage
    assert power.mape is not None and linear.mape is not None and power.mape < linear.mape


def test_backtest_scores_the_strict_law_exactly_on_its_own_curve() -> None:
    points = tuple((s, strict_ppl(30.0, s)) for s in SPARSITIES)
    scores = {(s.predictor, s.mode): s for s in backtest([Curve("strict", "m", "slicegpt", 30.0, points)])}
    assert scores[(STRICT, ZERO_CURVE)].max_ape == pytest.approx(0.0, abs=1e-12)
    assert scores[(CALIBRATED, ONE_POINT)].n == len(SPARSITIES) * (len(SPARSITIES) - 1)


def test_the_face_value_lens_law_needs_no_curve() -> None:
    features = {"lens-kl-sum": tuple(0.5 * s for s in SPARSITIES)}
    points = tuple((s, 20.0 * math.exp(0.5 * s)) for s in SPARSITIES)
    scores = {
        (s.predictor, s.mode): s for s in backtest([Curve("only", "m", "slicegpt", 20.0, points, features)])
    }
    assert scores[(FACE_VALUE, ZERO_CURVE)].max_ape == pytest.approx(0.0, abs=1e-12)
    # Alone in the store, the feature law's zero-point prior is the face value too.
    assert scores[("feature law: lens-kl-sum", ZERO_MODEL)].n == len(SPARSITIES)


def _signal(values: tuple[float, ...], lens: dict[int, LensMeans] | None = None) -> SignalSpectrum:
    total = sum(values)
    return SignalSpectrum(0, "output", 0, values, tuple(v / total for v in values), lens or {})


def test_discarded_energy_features_read_the_spectrum_tail() -> None:
    a, b = _signal((4.0, 3.0, 2.0, 1.0)), _signal((9.0, 1.0, 0.0, 0.0))
    assert a.discarded(2) == pytest.approx(0.3)
    assert b.discarded(2) == 0.0
    assert feature_value("energy-mean", [a, b], 2) == pytest.approx(0.15)
    assert feature_value("energy-weighted", [a, b], 2) == pytest.approx(3.0 / 20.0)
    assert feature_value("energy-max", [a, b], 2) == pytest.approx(0.3)
    assert set(FEATURES) >= {"energy-mean", "token-energy-mean", "lens-kl-sum", "lens-taylor-sum"}


def test_lens_readings_interpolate_between_profiled_widths_and_vanish_at_full_width() -> None:
    signal = _signal((4.0, 3.0, 2.0, 1.0), {2: LensMeans(0.4, 0.38, 0.5)})
    assert lens_value(signal, 2, lambda m: m.kl) == 0.4
    assert lens_value(signal, 3, lambda m: m.kl) == pytest.approx(0.2)  # halfway to 0 at d = D = 4
    with pytest.raises(ValueError, match="outside the profiled widths"):
        lens_value(signal, 1, lambda m: m.kl)


def test_the_exponent_spread_widens_the_band_away_from_where_c_was_pinned() -> None:
    coefficient = feature_laws.Coefficient(3.0, 0.0, 0.03, "test")
    spread = feature_laws.Exponent(0.6, 0.1)
    anchor = math.log(0.02)
    at_anchor = feature_laws.predict(25.0, 0.02, coefficient, exponent=spread, log_anchor=anchor)
    far = feature_laws.predict(25.0, 0.08, coefficient, exponent=spread, log_anchor=anchor)
    assert at_anchor.log_sd == pytest.approx(0.03)  # a wrong beta costs nothing where c is measured
    expected = math.hypot(0.03, 3.0 * 0.08**0.6 * math.log(0.08 / 0.02) * 0.1)
    assert far.log_sd == pytest.approx(expected)
    assert far.value == pytest.approx(25.0 * math.exp(3.0 * 0.08**0.6))


def test_the_calibrated_record_scores_what_the_law_rung_answers_short_of_the_first_point() -> None:
    """Leave-one-sparsity-out holds out s = 0.1 of an affine curve: the law fitted on 0.2-0.5 answers
    there from the dense value (`Calibration.predict`), and that answer is what the record scores."""
    ppl0, a, b = 30.0, 0.45, 0.5
    points = tuple((s, ppl0 ** (1 / (a + b * (1 - s)))) for s in (0.1, 0.2, 0.3, 0.4, 0.5))
    scores = backtest([Curve("affine curve", "m", "slicegpt", ppl0, points)])
    [loso] = [s for s in scores if s.predictor == CALIBRATED and s.mode == LOSO]
    held = next(p for p in loso.points if p.sparsity == 0.1)
    answered = calibrate_ppl(ppl0, points[1:]).predict(0.1)
    assert held.predicted == pytest.approx(answered.value)
    assert "interpolated_from_dense" in answered.flags
