"""Which prior a prediction for a model takes follows from what the store knows of the model, by a
rule fixed in code, never from the records that then judge it."""

from __future__ import annotations

import math

import pytest

from app.services.prediction.profile_rung import NESTED_MODE, _known_mode, nested_choice_score
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
