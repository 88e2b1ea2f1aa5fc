"""What a simulated answer says its values rest on: how many windows, and whose windows they were
paired with (the dense model's, or a reference point of the curve scored on every window)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from app.services.prediction.simulated import _window_dtype_said, _windows_said
from core.tables import Result


def _row(windows: int, paired_with: str | None) -> Result:
    sampling: dict[str, Any] = {
        "windows": windows,
        "of_windows": 40,
        "order_seed": 42,
        "estimator": "regression",
        "precision": 0.02,
        "paired_with": paired_with,
    }
    return cast(Result, SimpleNamespace(protocol={"sampling": sampling, "windows": windows}))


def test_the_answer_names_the_reference_point_the_others_were_paired_with() -> None:
    said = _windows_said(
        [
            _row(40, "dense"),
            _row(24, "the simulated point at s=0.3"),
            _row(32, "the simulated point at s=0.3"),
        ]
    )
    assert "each point on 24-40 of 40 windows (seeded order 42)" in said
    assert "paired with the simulated point at s=0.3's (regression estimator)" in said
    assert "dense" not in said  # the reference itself used every window: paired with nothing


def test_the_answer_says_the_dense_model_where_it_paired_the_points() -> None:
    said = _windows_said([_row(8, "dense"), _row(12, None)])  # rows stored before the field: the dense model
    assert "each point on 8-12 of 40 windows" in said and "paired with the dense model's" in said


def test_the_answer_says_where_windows_past_the_pilot_ran_in_a_cheaper_dtype() -> None:
    said = _window_dtype_said({"window_dtype": "bfloat16"}, "float32")
    assert "windows past the pilot scored in bfloat16" in said and "dense model's bfloat16 gap" in said
    on_copy = _window_dtype_said({"window_dtype": "bfloat16", "pilot_on_copy": True}, "float32")
    assert "the pilot and further windows scored in bfloat16" in on_copy  # no anchor: the pilot too
    assert _window_dtype_said({"window_dtype": "float32"}, "float32") == ""  # the model's own: nothing to say
    assert _window_dtype_said({}, "float32") == ""  # rows stored before the field, or every window
