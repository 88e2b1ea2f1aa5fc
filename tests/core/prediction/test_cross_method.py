"""Pooling across methods: the two-way prior recovers the effects that generated the coefficients,
refuses pairs nothing links, and its bands cover as often as they say."""

from __future__ import annotations

import math
import random

import pytest

from core.prediction import cross_method
from core.prediction.backtests import CROSS_METHOD, ZERO_MODEL, Curve, backtest, cross_method_prior
from core.prediction.backtests import FeatureLaw as Law
from core.prediction.feature_laws import CurveFit

SPARSITIES = (0.2, 0.3, 0.4, 0.5, 0.6)
FEATURE = "output-error-mean"


def _cell(method: str, model: str, c: float) -> cross_method.Cell:
    return cross_method.Cell(method, model, CurveFit(c=c, se=1e-9, residual_sq=0.0, dof=4))


def test_the_additive_fit_recovers_method_and_model_effects() -> None:
    mu = {"wanda": 1.2, "sparsegpt": 0.4, "magnitude": 2.5}
    u = {"a": -0.3, "b": 0.1, "c": 0.7}
    cells = [(k, m, mu[k] + u[m]) for k in mu for m in u if (k, m) != ("sparsegpt", "c")]
    effects = cross_method.fit_effects(cells)
    assert effects.at("sparsegpt", "c") == pytest.approx(mu["sparsegpt"] + u["c"], abs=1e-12)
    for k in mu:
        assert effects.method[k] - effects.method["wanda"] == pytest.approx(mu[k] - mu["wanda"], abs=1e-12)


def test_the_prior_of_a_missing_pair_is_the_ratio_the_model_shows_under_another_method() -> None:
    # Two models and two methods, one pair missing: c = c(k, other) * c(j, model) / c(j, other).
    cells = [_cell("wanda", "gemma", 3.0), _cell("wanda", "smol", 2.0), _cell("sparsegpt", "smol", 1.0)]
    prior = cross_method.two_way_prior(cells, "sparsegpt", "gemma", "test")
    assert prior is not None
    assert prior.value == pytest.approx(1.0 * 3.0 / 2.0, rel=1e-12)
    # Three cells, three effects: nothing estimates the interaction, so its spread is the prior's,
    # and the three cells' errors add to the pair's own (1 + 3 weights of 1).
    assert prior.sd / prior.value == pytest.approx(math.sqrt(4 * 0.5**2), rel=1e-9)
    weights = cross_method.prediction_weights([(c.method, c.model) for c in cells], "sparsegpt", "gemma")
    assert weights == pytest.approx([1.0, -1.0, 1.0], abs=1e-12)


def test_pairs_no_cell_links_get_no_prior() -> None:
    cells = [_cell("wanda", "smol", 2.0), _cell("sparsegpt", "gemma", 1.0)]
    assert cross_method.two_way_prior(cells, "sparsegpt", "smol", "test") is None
    assert cross_method.two_way_prior(cells, "magnitude", "gemma", "test") is None
    # A cell of the pair itself is never its own prior.
    assert cross_method.two_way_prior([_cell("wanda", "smol", 2.0)], "wanda", "smol", "test") is None


def _synthetic(
    methods: dict[str, float], models: int, model_spread: float, interaction: float, seed: int
) -> list[Curve]:
    """Curves whose coefficients follow ln c = mu[k] + u[m] + e, u ~ N(0, model_spread^2),
    e ~ N(0, interaction^2); ln PPL - ln PPL0 = c F with noise of sd 0.03 per point."""
    rng = random.Random(seed)
    features = tuple(0.05 + 0.4 * s * s for s in SPARSITIES)
    curves = []
    for m in range(models):
        u = rng.gauss(0.0, model_spread)
        for method, mu in methods.items():
            c = math.exp(mu + u + rng.gauss(0.0, interaction))
            points = tuple(
                (s, 25.0 * math.exp(c * f + rng.gauss(0.0, 0.03)))
                for s, f in zip(SPARSITIES, features, strict=True)
            )
            curves.append(Curve(f"{method} on m{m}", f"m{m}", method, 25.0, points, {FEATURE: features}))
    return curves


def test_cross_method_bands_of_a_correctly_specified_model_cover_near_their_level() -> None:
    curves = _synthetic({"wanda": 1.0, "sparsegpt": 0.5, "magnitude": 2.0}, 40, 0.4, 0.15, seed=3)
    scored = [c for c in curves if c.method == "wanda"]
    siblings = [c for c in curves if c.method != "wanda"]
    scores = {(s.predictor, s.mode): s for s in backtest(scored, siblings=siblings)}
    cross = scores[(Law(FEATURE).predictor, CROSS_METHOD)]
    assert cross.n == len(scored) * len(SPARSITIES)
    assert cross.coverage is not None and 0.88 <= cross.coverage <= 0.99, cross.coverage
    # The model's own sensitivity, seen under the other methods, is what the per-method pooling
    # cannot know: with models this different, carrying it over predicts better.
    per_method = scores[(Law(FEATURE).predictor, ZERO_MODEL)]
    assert cross.mape is not None and per_method.mape is not None
    assert cross.mape < 0.6 * per_method.mape


def test_cross_method_prior_leaves_out_every_curve_of_the_held_out_pair() -> None:
    curves = _synthetic({"wanda": 1.0, "sparsegpt": 0.5}, 3, 0.4, 0.0, seed=4)
    target = next(c for c in curves if c.method == "sparsegpt" and c.model == "m0")
    # A second calibration of the held-out pair, far off: it must not move the prior.
    decoy = Curve(
        "sparsegpt on m0 (other data)", "m0", "sparsegpt", 25.0, target.points, {FEATURE: (1.0,) * 5}
    )
    law = Law(FEATURE)
    with_decoy = cross_method_prior(law, [*curves, decoy], "sparsegpt", "m0")
    without = cross_method_prior(law, curves, "sparsegpt", "m0")
    assert with_decoy is not None and without is not None and with_decoy.prior is not None
    assert without.prior is not None
    assert with_decoy.prior.value == pytest.approx(without.prior.value, rel=1e-12)
    assert "sparsegpt on m0" not in with_decoy.prior.source
    # No other method measured on the model: nothing to carry over.
    assert cross_method_prior(law, [c for c in curves if c.method == "sparsegpt"], "sparsegpt", "m0") is None
