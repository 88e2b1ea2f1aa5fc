"""Which prior a prediction for a model takes, from what the store knows of the model and from the
backtest record of each way of knowing it."""

from __future__ import annotations

from app.services.profiles import _known_mode
from core.backtests import CROSS_METHOD, ONE_POINT, ZERO_CURVE, ZERO_MODEL, Curve, HeldOut, Score

POINTS = ((0.2, 30.0), (0.4, 40.0))


def curve(model: str, method: str, calibration: tuple[object, ...] = ("boolq",)) -> Curve:
    return Curve(f"{model} / {method} / {calibration}", model, method, 25.0, POINTS, calibration=calibration)


def record(mode: str, ape: float) -> dict[tuple[str, str], Score]:
    held = tuple(HeldOut("c", 0.1 * i, 100.0, 100.0 * (1 + ape), None, "x") for i in range(3))
    return {
        ("feature law: output-error-mean", mode): Score("feature law: output-error-mean", mode, 0.95, held)
    }


def test_what_is_known_of_the_model_sets_the_mode() -> None:
    own, other_model = curve("new", "sparsegpt"), curve("old", "sparsegpt")
    assert _known_mode("new", own, [other_model], [], {}) == (ONE_POINT, "")
    other_calibration = curve("new", "sparsegpt", ("lambada",))
    assert _known_mode("new", None, [other_model, other_calibration], [], {}) == (ZERO_CURVE, "")
    assert _known_mode("new", None, [other_model], [curve("old", "wanda")], {}) == (ZERO_MODEL, "")


def test_the_models_other_methods_answer_unless_their_record_is_worse_than_pooling() -> None:
    others, siblings = [curve("old", "sparsegpt")], [curve("new", "wanda"), curve("old", "wanda")]
    assert _known_mode("new", None, others, siblings, {}) == (CROSS_METHOD, "")  # nothing scored yet
    better = {**record(CROSS_METHOD, 0.05), **record(ZERO_MODEL, 0.10)}
    assert _known_mode("new", None, others, siblings, better) == (CROSS_METHOD, "")
    worse = {**record(CROSS_METHOD, 0.45), **record(ZERO_MODEL, 0.08)}
    mode, why = _known_mode("new", None, others, siblings, worse)
    assert mode == ZERO_MODEL and "carried over 45.0%, pooled 8.0%" in why
    unscored = record(ZERO_MODEL, 0.08)  # pooling has a record, carrying over none
    mode, why = _known_mode("new", None, others, siblings, unscored)
    assert mode == ZERO_MODEL and "not scored yet" in why
