"""Records score misses by |ln(predicted / measured)|, pool them model -> curve -> point, and earn a
verdict by fixed thresholds; a model nobody has measured is never judged on one model's record."""

from __future__ import annotations

import math

import pytest

from core.prediction.backtests import ZERO_MODEL, HeldOut, Score
from core.prediction.records import MIN_MODELS_NEW, choose, log_error, nested, summarize, verdict


def held(model: str, curve: str, factor: float, covered: bool = True) -> HeldOut:
    """A point measured at 100 and predicted `factor` times that, inside its band or not."""
    band = (1.0, 1e9) if covered else (1.0, 2.0)
    return HeldOut(model, curve, 0.3, 100.0, 100.0 * factor, band, "other models")


def test_a_miss_is_as_wrong_two_times_high_as_two_times_low() -> None:
    assert log_error(200.0, 100.0) == pytest.approx(log_error(50.0, 100.0)) == pytest.approx(math.log(2))
    assert log_error(math.inf, 100.0) == math.inf


def test_records_pool_models_before_curves_before_points() -> None:
    """Three curves of one model count once: model a misses by x1.1 on each of its curves, model b
    by x3 on its one curve; the pooled miss is the mean of the two models, not of the four curves."""
    misses = [held("a", f"a{i}", 1.1) for i in range(3)] + [held("b", "b0", 3.0), held("b", "b0", 3.0)]
    summary = summarize(misses)
    assert summary.models == 2 and summary.curves == 4 and summary.points == 5
    assert summary.log_error == pytest.approx((math.log(1.1) + math.log(3.0)) / 2)
    by_curve = (3 * math.log(1.1) + math.log(3.0)) / 4
    assert summary.log_error != pytest.approx(by_curve)
    assert summary.sigma == pytest.approx(math.sqrt((math.log(1.1) ** 2 + math.log(3.0) ** 2) / 2))


@pytest.mark.parametrize(
    ("factors", "level"),
    [
        ([1.05, 0.92, 1.1], "reliable"),
        ([1.3, 0.75, 1.2], "rough"),
        ([1.6, 0.5, 2.0], "unreliable"),
        ([1 / 20, 1 / 20, 1 / 20], "unreliable"),  # 20x too low is as bad as 20x too high
    ],
)
def test_the_verdict_follows_the_typical_log_miss(factors: list[float], level: str) -> None:
    misses = [held(model, model, f) for model, f in zip("abc", factors, strict=True)]
    result = verdict(summarize(misses, [m.covered for m in misses]), new_model=True)
    assert result.level == level
    assert (result.models, result.curves, result.points) == (3, 3, 3)
    assert "3 model(s)" in result.advice and "band coverage 100%" in result.advice


def test_a_new_model_is_not_judged_on_one_models_record() -> None:
    misses = [held("a", "a0", 1.01), held("a", "a1", 1.02), held("a", "a2", 1.01)]
    summary = summarize(misses)
    assert verdict(summary, new_model=False).level == "reliable"
    new = verdict(summary, new_model=True)
    assert new.level == "unscored" and f"at least {MIN_MODELS_NEW} models" in new.advice


def test_too_few_points_or_none_is_unscored() -> None:
    assert verdict(None, new_model=False).level == "unscored"
    assert verdict(summarize([held("a", "a", 1.0), held("b", "b", 1.0)]), new_model=False).level == "unscored"


def test_a_backtest_score_carries_the_pooled_summary_and_coverage() -> None:
    points = (held("a", "a", 2.0, covered=False), held("b", "b", 1.0), held("b", "b", 1.0))
    score = Score("x", ZERO_MODEL, 0.95, points)
    assert score.summary.log_error == pytest.approx(math.log(2.0) / 2)
    assert score.coverage == pytest.approx(2 / 3)


def test_a_nested_choice_never_sees_the_points_that_judge_it() -> None:
    """A planted leak: `lucky` is perfect on model a and x1.3 off on b; `steady` is x1.2 off on both.
    Chosen on all points, `lucky` wins (pooled 0.13 < 0.18) and its record claims a typical x1.14.
    Nested, model a is judged by the choice made on b alone (`steady`), and b by the choice made on a
    (`lucky`): the record is x1.2 on a and x1.3 on b, worse than the leaky one, as it should be."""
    lucky = [held("a", "a", 1.0)] * 3 + [held("b", "b", 1.3)] * 3
    steady = [held("a", "a", 1.2)] * 3 + [held("b", "b", 1.2)] * 3
    candidates = {"lucky": lucky, "steady": steady}
    assert choose(candidates) == "lucky"
    assert choose(candidates, exclude_model="a") == "steady"
    assert choose(candidates, exclude_model="b") == "lucky"
    record = summarize(nested(candidates))
    leaky = summarize(lucky)
    assert record.log_error == pytest.approx((math.log(1.2) + math.log(1.3)) / 2)
    assert leaky.log_error is not None and record.log_error > leaky.log_error


def test_choose_needs_enough_points() -> None:
    assert choose({"x": [held("a", "a", 1.0)]}) is None
