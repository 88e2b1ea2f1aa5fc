"""Backtests: every predictor scored on measured curves it did not see (docs/science.md, "Predicting
before pruning").

A curve is one model, method and protocol measured at several sparsities, with the dense
perplexity and, where the model was profiled under the same calibration, each feature's value at
each measured width. Modes, each scoring a prediction only on points its coefficient did not see:

- `zero-points, leave-one-curve-out`: a feature law's coefficient pooled from every *other* curve of
  the method (`core.prediction.feature_laws.pool`), and a power law's exponent too; the strict law (slicing's
  curves only) and the lens-KL sum at face value need none;
- `zero-points, leave-one-model-out`: pooled only from curves of *other models*, the question a
  team with a new model asks;
- `zero-points, other methods of the model`: no point of this method on the held-out curve's model,
  but curves of sibling methods (those predicted from the same kind of feature) on it and on other
  models: the two-way prior of `core.prediction.cross_method`, which carries the model's sensitivity over from
  the methods it was measured under; every curve of this method on this model is left out;
- `one-point`: each measured point of a curve in turn is the only one known; the feature laws update
  the leave-one-curve-out prior with it (or fit it alone when no other curve has the feature), the
  calibrated laws (`core.prediction.laws`) fit it alone; the others are predicted;
- `leave-one-sparsity-out`: the calibrated laws fitted on every other point of the curve.

The law rung adds one: `alpha law pooled over other models` (leave-one-model-out, the law a model with
no pruned point of its own answers with).

Scores: the |ln(predicted / measured)| miss pooled model -> curve (`core.prediction.records`), MAPE
beside it for comparison with older records, and the coverage of the stated band at its level (a
95 % band should hold about 95 % of held-out points). Pure Python.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from core.methods import stored_method_entry
from core.prediction import cross_method, feature_laws, law_prediction, laws, priors, records
from core.prediction.feature_laws import Coefficient
from core.profiles import UNCALIBRATED_FEATURE


@dataclass(frozen=True)
class Curve:
    """One measured curve and the profile features at its points."""

    label: str  # model, method and protocol, as a reader would name the curve
    model: str
    method: str
    ppl0: float
    points: tuple[tuple[float, float], ...]  # (sparsity, measured PPL), pruned points only
    features: dict[str, tuple[float, ...]] = field(default_factory=dict)  # name -> F at each point
    calibration: tuple[Any, ...] = ()  # what identifies the calibration windows (core.profiles)

    def feature_points(
        self, name: str, indices: Iterable[int] | None = None, exponent: float = 1.0
    ) -> list[tuple[float, float]]:
        """(F^exponent, ln PPL - ln PPL0) at the chosen points (all by default)."""
        chosen = range(len(self.points)) if indices is None else indices
        return [(self.features[name][i] ** exponent, math.log(self.points[i][1] / self.ppl0)) for i in chosen]


@dataclass(frozen=True)
class HeldOut:
    """One held-out point: whose it was, what was predicted, from what, and how it landed."""

    model: str
    curve: str
    sparsity: float
    measured: float
    predicted: float
    band: tuple[float, float] | None
    fitted_on: str
    distance: float | None = None  # from the one point the prediction was fitted on, in sparsity

    @property
    def ape(self) -> float:
        return abs(self.predicted - self.measured) / self.measured

    @property
    def log_error(self) -> float:
        return records.log_error(self.predicted, self.measured)

    @property
    def covered(self) -> bool | None:
        return None if self.band is None else self.band[0] <= self.measured <= self.band[1]


@dataclass(frozen=True)
class Score:
    """A predictor's held-out record in one mode: scored by |ln| miss pooled model -> curve
    (`summary`); the mean absolute percentage error is kept for comparison with older records."""

    predictor: str
    mode: str
    level: float
    points: tuple[HeldOut, ...]

    @property
    def n(self) -> int:
        return len(self.points)

    @cached_property
    def summary(self) -> records.Summary:
        return records.summarize(self.points, [p.covered for p in self.points])

    @property
    def mape(self) -> float | None:
        return math.fsum(p.ape for p in self.points) / self.n if self.points else None

    @property
    def max_ape(self) -> float | None:
        return max((p.ape for p in self.points), default=None)

    @property
    def coverage(self) -> float | None:
        return self.summary.coverage


ZERO_CURVE = "zero-points, leave-one-curve-out"
ZERO_MODEL = "zero-points, leave-one-model-out"
CROSS_METHOD = "zero-points, other methods of the model"
ONE_POINT = "one-point"
LOSO = "leave-one-sparsity-out"


@dataclass(frozen=True)
class FeatureLaw:
    """ln PPL - ln PPL0 = c F^beta in one profile feature: beta = 1 (a feature law), or beta pooled
    from the training curves (a power law)."""

    feature: str
    power: bool = False

    @property
    def predictor(self) -> str:
        return f"{'power' if self.power else 'feature'} law: {self.feature}"


def feature_predictor(name: str, power: bool = False) -> str:
    """How a feature law is named in scores and answers."""
    return FeatureLaw(name, power).predictor


FACE_VALUE = f"{UNCALIBRATED_FEATURE} at face value (c = 1)"
STRICT = "strict law"
CALIBRATED = "calibrated law"
POOLED_ALPHA = "alpha law pooled over other models"


@dataclass(frozen=True)
class LawFit:
    """What a feature law knows from its training curves: its exponent and the prior of c (None
    when no training curve has the feature and the law has no face value)."""

    exponent: feature_laws.Exponent
    prior: Coefficient | None
    log_anchor: float = 0.0  # mean ln F of the training points: where the prior's c is pinned


def law_prior(law: FeatureLaw, training: Sequence[Curve]) -> LawFit | None:
    """The exponent and the empirical-Bayes prior of c from `training` (None when the law cannot
    answer at all: a power law needs curves to pool its exponent from)."""
    usable = [c for c in training if law.feature in c.features]
    exponent = feature_laws.LINEAR
    if law.power:
        pooled = feature_laws.pooled_exponent([c.feature_points(law.feature) for c in usable])
        if pooled is None:
            return None
        exponent = pooled
    fits = []
    for curve in usable:
        try:
            fits.append(feature_laws.fit_curve(curve.feature_points(law.feature, exponent=exponent.value)))
        except ValueError:
            continue
    if fits:
        labels = ", ".join(c.label for c in usable)
        beta = f", beta = {exponent.value:.3g} +- {exponent.sd:.2g}" if law.power else ""
        prior = feature_laws.pool(fits, f"pooled over {len(fits)} curve(s){beta}: {labels}")
        anchor = feature_laws.log_anchor([p for c in usable for p in c.feature_points(law.feature)])
        return LawFit(exponent, prior, anchor)
    if law.feature == UNCALIBRATED_FEATURE and not law.power:
        return LawFit(exponent, feature_laws.uncalibrated())
    return LawFit(exponent, None)


def cross_method_prior(law: FeatureLaw, training: Sequence[Curve], method: str, model: str) -> LawFit | None:
    """The exponent pooled from `method`'s training curves and the two-way prior of c for `method`
    on `model` (`core.prediction.cross_method`), each training curve fitted under its own method's exponent;
    None when `method` has no training curve with the feature, or no curve links it to the model."""
    usable = [
        c for c in training if law.feature in c.features and not (c.method == method and c.model == model)
    ]
    if not any(c.method == method for c in usable) or not any(c.model == model for c in usable):
        return None
    exponents: dict[str, feature_laws.Exponent] = {}
    for name in sorted({c.method for c in usable}):
        if not law.power:
            exponents[name] = feature_laws.LINEAR
        elif pooled := feature_laws.pooled_exponent(
            [c.feature_points(law.feature) for c in usable if c.method == name]
        ):
            exponents[name] = pooled
    if method not in exponents:
        return None
    cells = []
    for curve in usable:
        if curve.method not in exponents:
            continue
        try:
            points = curve.feature_points(law.feature, exponent=exponents[curve.method].value)
            cells.append(cross_method.Cell(curve.method, curve.model, feature_laws.fit_curve(points)))
        except ValueError:
            continue
    labels = ", ".join(c.label for c in usable)
    beta = f", beta = {exponents[method].value:.3g} +- {exponents[method].sd:.2g}" if law.power else ""
    source = f"method and model effects over {len(cells)} curve(s){beta}: {labels}"
    prior = cross_method.two_way_prior(cells, method, model, source)
    if prior is None:
        return None
    anchor = feature_laws.log_anchor(
        [p for c in usable if c.method == method for p in c.feature_points(law.feature)]
    )
    return LawFit(exponents[method], prior, anchor)


def law_coefficient(fit: LawFit, own: Sequence[tuple[float, float]], own_source: str) -> Coefficient | None:
    """c given the prior and the curve's own (F^beta, y) points; fitted on the points alone without a
    prior; None when nothing informs it."""
    if fit.prior is not None:
        return feature_laws.posterior(fit.prior, own)
    try:
        return feature_laws.from_points(own, own_source)
    except ValueError:
        return None


def backtest(
    curves: Sequence[Curve], *, siblings: Sequence[Curve] = (), level: float = law_prediction.DEFAULT_LEVEL
) -> list[Score]:
    """Every predictor in every mode over `curves` (see the module docstring); `siblings` are
    curves of other methods with the same kinds of feature, which only the cross-method mode
    trains on and which are not scored."""
    scores: list[Score] = []
    features = sorted({name for curve in curves for name in curve.features})
    for law in (FeatureLaw(name, power) for name in features for power in (False, True)):
        with_feature = [c for c in curves if law.feature in c.features]
        for mode, others in ((ZERO_CURVE, _other_curves), (ZERO_MODEL, _other_models)):
            held = []
            for curve in with_feature:
                fit = law_prior(law, others(curve, with_feature))
                if fit is not None and fit.prior is not None:
                    every = range(len(curve.points))
                    held += _predict_all(curve, law, fit, fit.prior, every, fit.prior.source, fit.log_anchor)
            scores.append(Score(law.predictor, mode, level, tuple(held)))
        pool = [*with_feature, *(c for c in siblings if law.feature in c.features)]
        scores.append(
            Score(law.predictor, CROSS_METHOD, level, tuple(_cross_method_held(law, with_feature, pool)))
        )
        held = []
        for curve in with_feature:
            fit = law_prior(law, _other_curves(curve, with_feature))
            if fit is None:
                continue
            for anchor in range(len(curve.points)):
                at = f"s = {curve.points[anchor][0]:g}"
                own = curve.feature_points(law.feature, [anchor], fit.exponent.value)
                coefficient = law_coefficient(fit, own, f"{at} alone")
                if coefficient is None:
                    continue  # F = 0 at the anchor: it says nothing about c
                rest = [i for i in range(len(curve.points)) if i != anchor]
                fitted_on = (
                    coefficient.source if fit.prior is None else f"{at} and the prior {fit.prior.source}"
                )
                pinned = feature_laws.log_anchor(curve.feature_points(law.feature, [anchor]))
                held += _predict_all(curve, law, fit, coefficient, rest, fitted_on, pinned)
        scores.append(Score(law.predictor, ONE_POINT, level, tuple(held)))
    face = [
        point
        for curve in curves
        if UNCALIBRATED_FEATURE in curve.features
        for point in _predict_all(
            curve,
            FeatureLaw(UNCALIBRATED_FEATURE),
            LawFit(feature_laws.LINEAR, None),
            feature_laws.uncalibrated(),
            range(len(curve.points)),
            "nothing",
        )
    ]
    scores.append(Score(FACE_VALUE, ZERO_CURVE, level, tuple(face)))
    strict = tuple(p for c in curves if _strict_law_applies(c.method) for p in _strict(c))
    scores.append(Score(STRICT, ZERO_CURVE, level, strict))
    for mode, one_point in ((ONE_POINT, True), (LOSO, False)):
        calibrated = tuple(p for c in curves for p in _calibrated(c, level, one_point=one_point))
        scores.append(Score(CALIBRATED, mode, level, calibrated))
    scores.append(Score(POOLED_ALPHA, ZERO_MODEL, level, tuple(_pooled_alpha_held(curves, level))))
    return scores


def curve_points(curve: Curve) -> priors.CurvePoints:
    return priors.CurvePoints(curve.model, curve.label, curve.ppl0, curve.points)


def _pooled_alpha_held(curves: Sequence[Curve], level: float) -> list[HeldOut]:
    """Each curve predicted by the alpha law pooled over the method's curves of other models."""
    held = []
    for curve in curves:
        prior = priors.pooled_alpha([curve_points(c) for c in _other_models(curve, curves)])
        if prior is None:
            continue
        for s, ppl in curve.points:
            value, band = priors.predict(curve.ppl0, prior, s, level)
            held.append(HeldOut(curve.model, curve.label, s, ppl, value, band, prior.source))
    return held


def _cross_method_held(law: FeatureLaw, curves: Sequence[Curve], pool: Sequence[Curve]) -> list[HeldOut]:
    """Each curve predicted with zero points of its method on its model, from the other cells of
    `pool` (`cross_method_prior` leaves out every curve of the held-out pair)."""
    held = []
    for curve in curves:
        fit = cross_method_prior(law, pool, curve.method, curve.model)
        if fit is not None and fit.prior is not None:
            every = range(len(curve.points))
            held += _predict_all(curve, law, fit, fit.prior, every, fit.prior.source, fit.log_anchor)
    return held


def _strict_law_applies(method: str) -> bool:
    """The strict law is a law of slicing; the other methods' curves are not scored by it."""
    entry = stored_method_entry(method)
    return entry is None or entry.strict_law_applies  # an unknown name (a published curve) is slicing's


def _other_curves(curve: Curve, pool: Sequence[Curve]) -> list[Curve]:
    return [c for c in pool if c.method == curve.method and c.label != curve.label]


def _other_models(curve: Curve, pool: Sequence[Curve]) -> list[Curve]:
    return [c for c in pool if c.method == curve.method and c.model != curve.model]


def _predict_all(
    curve: Curve,
    law: FeatureLaw,
    fit: LawFit,
    coefficient: Coefficient,
    indices: Iterable[int],
    fitted_on: str,
    log_anchor: float = 0.0,
) -> list[HeldOut]:
    held = []
    for i in indices:
        s, measured = curve.points[i]
        feature = curve.features[law.feature][i]
        predicted = feature_laws.predict(
            curve.ppl0, feature, coefficient, exponent=fit.exponent, log_anchor=log_anchor
        )
        held.append(
            HeldOut(curve.model, curve.label, s, measured, predicted.value, predicted.band, fitted_on)
        )
    return held


def _strict(curve: Curve) -> list[HeldOut]:
    return [
        HeldOut(
            curve.model,
            curve.label,
            s,
            ppl,
            laws.strict_ppl(curve.ppl0, s),
            None,
            "nothing (needs only PPL0)",
        )
        for s, ppl in curve.points
    ]


def _calibrated(curve: Curve, level: float, *, one_point: bool) -> list[HeldOut]:
    held = []
    for i, (s, ppl) in enumerate(curve.points):
        others = [p for j, p in enumerate(curve.points) if j != i]
        trainings: list[list[tuple[float, float]]] = [[p] for p in others] if one_point else [others]
        for training in trainings:
            if not training:
                continue
            prediction = laws.calibrate_ppl(curve.ppl0, training).predict(s, level)
            fitted_on = ", ".join(f"s = {t:g}" for t, _ in training)
            distance = min(abs(s - t) for t, _ in training)
            held.append(
                HeldOut(
                    curve.model, curve.label, s, ppl, prediction.value, prediction.band, fitted_on, distance
                )
            )
    return held
