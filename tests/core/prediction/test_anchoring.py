"""A simulated curve scaled through anchors passes through them, with the form the anchors can pin."""

from __future__ import annotations

import math

import pytest

from core.prediction.anchoring import Anchor, fit_scale

DENSE = 20.0


def _curve(c: float, slope: float = 0.0) -> list[Anchor]:
    """Anchors on a simulation whose log-increase the method multiplies by c + slope * s."""
    anchors = []
    for s in (0.2, 0.4, 0.5):
        simulated = DENSE * math.exp(6.0 * s)
        anchors.append(Anchor(s, simulated, DENSE * math.exp((c + slope * s) * 6.0 * s)))
    return anchors


def test_one_anchor_scales_by_a_constant_and_passes_through_it() -> None:
    anchor = _curve(0.8, slope=0.5)[0]
    scale = fit_scale([anchor], DENSE)
    assert scale is not None and scale.form == "constant" and scale.slope == 0.0
    assert scale.apply(anchor.sparsity, anchor.simulated, DENSE) == pytest.approx(anchor.measured)
    assert scale.apply(0.0, DENSE, DENSE) == pytest.approx(DENSE)  # the dense point stays put


def test_two_anchors_give_a_line_in_s_through_both_and_recover_it_elsewhere() -> None:
    first, second, third = _curve(0.8, slope=0.5)
    scale = fit_scale([first, second], DENSE)
    assert scale is not None and scale.form == "linear"
    assert (scale.intercept, scale.slope) == pytest.approx((0.8, 0.5))
    for anchor in (first, second, third):
        assert scale.apply(anchor.sparsity, anchor.simulated, DENSE) == pytest.approx(anchor.measured)


def test_an_anchor_where_the_simulation_did_not_move_pins_nothing() -> None:
    assert fit_scale([Anchor(0.0, DENSE, DENSE)], DENSE) is None
    scale = fit_scale([Anchor(0.0, DENSE, DENSE), *_curve(0.9)[:1]], DENSE)
    assert scale is not None and scale.form == "constant" and scale.intercept == pytest.approx(0.9)
