"""Which prior a prediction for a model takes follows from what the store knows of the model, by a
rule fixed in code, never from the records that then judge it."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest

from app.services.prediction.profile_rung import NESTED_MODE, _chosen_nested, _known_mode, nested_choice_score
from core.prediction.backtests import CROSS_METHOD, ONE_POINT, ZERO_CURVE, ZERO_MODEL, Curve, HeldOut, Score

LAW = "feature law: output-error-depth-sum"

POINTS = ((0.2, 30.0), (0.4, 40.0))


def curve(model: str, method: str, calibration: tuple[object, ...] = ("boolq",)) -> Curve:
    return Curve(f"{model} / {method} / {calibration}", model, method, 25.0, POINTS, calibration=calibration)


def record(mode: str, factor: float, models: tuple[str, ...] = ("old",)) -> dict[tuple[str, str], Score]:
    held = tuple(
        HeldOut(m, m, 0.1 * (i + 1), 100.0, 100.0 * factor, None, "x") for m in models for i in range(3)
    )
    return {(LAW, mode): Score(LAW, mode, 0.95, held)}


def test_what_is_known_of_the_model_sets_the_mode() -> None:
    own, other_model = curve("new", "sparsegpt"), curve("old", "sparsegpt")
    assert _known_mode("new", own, [other_model], [], {}, None) == ONE_POINT
    other_calibration = curve("new", "sparsegpt", ("lambada",))
    assert _known_mode("new", None, [other_model, other_calibration], [], {}, None) == ZERO_CURVE
    assert _known_mode("new", None, [other_model], [curve("old", "wanda")], {}, None) == ZERO_MODEL


def test_carrying_over_or_pooling_is_chosen_on_records_that_never_saw_the_model() -> None:
    siblings = [curve("new", "wanda"), curve("old", "wanda")]
    others = [curve("old", "sparsegpt")]
    assert _known_mode("new", None, [], siblings, {}, LAW) == CROSS_METHOD  # nothing to pool from
    assert _known_mode("new", None, others, siblings, {}, LAW) == CROSS_METHOD  # nothing scored yet
    carried_better = {**record(CROSS_METHOD, 1.05), **record(ZERO_MODEL, 1.5)}
    assert _known_mode("new", None, others, siblings, carried_better, LAW) == CROSS_METHOD
    pooled_better = {**record(CROSS_METHOD, 1.6), **record(ZERO_MODEL, 1.1)}
    assert _known_mode("new", None, others, siblings, pooled_better, LAW) == ZERO_MODEL


def test_the_verdict_reads_the_nested_record_of_that_choice() -> None:
    scores = {**record(CROSS_METHOD, 1.05, models=("a", "b")), **record(ZERO_MODEL, 1.5, models=("a", "b"))}
    nested = nested_choice_score(scores, LAW, 0.95)
    assert nested.mode == NESTED_MODE and nested.summary.models == 2
    assert nested.summary.log_error == pytest.approx(math.log(1.05))


OTHER = "power law: output-error-mean"


def misses(name: str, mode: str, factors: dict[str, float]) -> dict[tuple[str, str], Score]:
    """Three held-out points per model, each missed by its model's factor."""
    held = tuple(
        HeldOut(m, m, 0.1 * (i + 1), 100.0, 100.0 * factor, None, "x")
        for m, factor in factors.items()
        for i in range(3)
    )
    return {(name, mode): Score(name, mode, 0.95, held)}


def answering(*names: str) -> list[Any]:
    return [SimpleNamespace(predictor=name) for name in names]


def test_the_profile_law_is_chosen_on_other_models_and_judged_nested() -> None:
    scores = {
        **misses(LAW, ZERO_MODEL, {"a": 1.5, "b": 1.5}),
        **misses(OTHER, ZERO_MODEL, {"a": 1.05, "b": 1.1}),
    }
    chosen = _chosen_nested(answering(LAW, OTHER), scores, ZERO_MODEL, "new", 0.95)
    assert chosen is not None
    name, reason, record = chosen
    assert name == OTHER and "2 other model(s)" in reason
    assert record.summary.models == 2  # each of a and b judged under the law chosen without it
    assert record.summary.log_error == pytest.approx((math.log(1.05) + math.log(1.1)) / 2)


def test_the_models_own_points_never_choose_its_profile_law() -> None:
    """A planted leak: OTHER is exact on the model's own curve and poor on every other model."""
    scores = {
        **misses(LAW, ONE_POINT, {"own": 1.5, "a": 1.1, "b": 1.1}),
        **misses(OTHER, ONE_POINT, {"own": 1.0, "a": 1.4, "b": 1.4}),
    }
    chosen = _chosen_nested(answering(LAW, OTHER), scores, ONE_POINT, "own", 0.95)
    assert chosen is not None and chosen[0] == LAW
    # The record is the choice's, made nested: "own" under LAW (chosen on a and b); a and b each under
    # OTHER, which the leak makes look best once they are held out. It shows what choosing costs here.
    assert chosen[2].summary.log_error == pytest.approx((math.log(1.5) + 2 * math.log(1.4)) / 3)


def test_without_other_models_records_the_registered_law_answers() -> None:
    scores = {**misses(LAW, ONE_POINT, {"own": 1.5}), **misses(OTHER, ONE_POINT, {"own": 1.0})}
    assert _chosen_nested(answering(LAW, OTHER), scores, ONE_POINT, "own", 0.95) is None
    only_answering_law = _chosen_nested(
        answering(LAW), {**scores, **misses(OTHER, ONE_POINT, {"a": 1.0})}, ONE_POINT, "own", 0.95
    )
    assert only_answering_law is None  # a law that cannot answer for this profile is never chosen
