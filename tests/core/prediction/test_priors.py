"""The law rung for a model with no pruned point: alpha pooled over other models, one vote each."""

from __future__ import annotations

import pytest

from core.prediction.priors import CurvePoints, pooled_alpha, ppl_at, predict

PPL0 = 20.0


def curve(model: str, alpha: float, label: str = "") -> CurvePoints:
    points = tuple((s, ppl_at(PPL0, alpha, s)) for s in (0.1, 0.2, 0.3, 0.4))
    return CurvePoints(model, label or model, PPL0, points)


def test_alpha_is_recovered_and_pooled_one_vote_per_model() -> None:
    """Model a has three curves at alpha 1.2, model b one at 1.8: the pooled alpha is 1.5, not 1.35."""
    prior = pooled_alpha(
        [curve("a", 1.2, "a1"), curve("a", 1.2, "a2"), curve("a", 1.2, "a3"), curve("b", 1.8)]
    )
    assert prior is not None and prior.models == 2 and prior.curves == 4
    assert prior.alpha == pytest.approx(1.5, rel=1e-6)
    assert prior.sd == pytest.approx(0.6 / 2**0.5, rel=1e-6)


def test_one_model_gives_no_band() -> None:
    prior = pooled_alpha([curve("a", 1.2)])
    assert prior is not None and prior.sd is None
    value, band = predict(PPL0, prior, 0.3, 0.95)
    assert value == pytest.approx(ppl_at(PPL0, 1.2, 0.3)) and band is None


def test_the_band_widens_with_sparsity_and_stays_above_the_dense_value() -> None:
    prior = pooled_alpha([curve("a", 1.2), curve("b", 1.6), curve("c", 1.4)])
    assert prior is not None
    widths = []
    for s in (0.1, 0.2, 0.3):
        value, band = predict(PPL0, prior, s, 0.95)
        assert band is not None and PPL0 <= band[0] < value < band[1]
        widths.append(band[1] / band[0])
    assert widths == sorted(widths)
