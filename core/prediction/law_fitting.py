"""Fitting a law linear in its parameters to measured points, and choosing between two such fits
(docs/science.md §2). `core.prediction.laws` names the forms and calibrates with them; this module is
the least squares and the leave-one-out choice they share, apart so each reads in one sitting.

Linearisation. Both PPL laws are linear in s in the ratio space r = ln PPL0 / ln PPL, the form the
paper states them in, and both accuracy laws are linear in y = ln(acc / acc0), so every fit is a
closed-form linear least squares: no optimiser, no starting values, no local minima. What a user
cares about is the *relative* error of the predicted value, so each point is weighted by the squared
Jacobian |d ln value / d y|: for PPL that is (ln PPL0 / r**2)**2 (the delta method), which makes a
residual of one unit mean about 100 % relative error at every sparsity; without it, high-sparsity
points (where a small error in r is a large error in PPL) would count no more than low ones. For
accuracy the Jacobian is 1.

Uncertainty. sigma, the relative error of one measurement about the law, is pooled from a prior
sigma0 (weight ``PRIOR_DOF`` degrees of freedom) and the weighted residuals, so it is the prior alone
when the fit has no spare points and is flagged then. The band is the normal-approximation interval
of a new measurement at s: parameter variance (which grows with the distance from the measured
sparsities) plus sigma, computed in the linear space and mapped through the exact transform, hence
asymmetric in PPL and unbounded once the law's lower edge reaches ln PPL0 / ln PPL = 0.

Choice. Each family has a one-parameter form anchored at the dense point and a two-parameter affine
form; the one with the lower leave-one-out error is chosen (rules in ``_select``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from core.prediction.law_prediction import (
    DEFAULT_LEVEL,
    FitQuality,
    Metric,
    Point,
    Prediction,
    _check_sparsity,
    _exp_or_inf,
    _z,
    fit_quality,
)

PRIOR_DOF = 2.0
"""How many residual degrees of freedom the prior sigma0 is worth when pooled with the residuals: two
spare points weigh as much as the prior, more points outweigh it."""


@dataclass(frozen=True)
class _Form:
    """A law linear in its parameters: y(s) = offset + design(s) . theta in the fitting space."""

    name: str
    formula: str
    param_names: tuple[str, ...]
    offset: float
    design: Callable[[float], tuple[float, ...]]
    anchored: bool
    """Passes through the dense point by construction, so [0, max s] is interpolation."""


@dataclass(frozen=True)
class Fit:
    """One law fitted to measured points (or a prior); ``predict`` answers at any sparsity."""

    metric: Metric
    form: _Form
    baseline: float
    """PPL0 or acc0, measured on the dense model."""
    points: tuple[Point, ...]
    theta: tuple[float, ...]
    theta_cov: tuple[tuple[float, ...], ...]
    sigma: float
    """Relative error of one measurement about the law (pooled prior and residuals)."""
    band_from_prior: bool
    chance: float | None = None
    loo_rel_error: float | None = None
    """Root mean square relative error when each point is predicted from the others; None if too few."""
    notes: tuple[str, ...] = ()

    @property
    def law(self) -> str:
        return self.form.name

    @property
    def params(self) -> dict[str, float]:
        return dict(zip(self.form.param_names, self.theta, strict=True))

    def _y(self, s: float) -> tuple[float, float]:
        """The law in its linear space at s: (value, variance of the fitted value)."""
        d = self.form.design(s)
        y = self.form.offset + sum(di * ti for di, ti in zip(d, self.theta, strict=True))
        var = sum(
            di * cij * dj
            for di, row in zip(d, self.theta_cov, strict=True)
            for cij, dj in zip(row, d, strict=True)
        )
        return y, var

    def _value(self, y: float) -> float:
        """Back from the linear space to the metric (accuracy unclipped)."""
        if self.metric == "ppl":
            return _exp_or_inf(math.log(self.baseline) / y) if y > 0.0 else math.inf
        return self.baseline * math.exp(y)

    def _jacobian(self, y: float) -> float:
        """|d ln value / dy|: turns an error in the linear space into a relative error."""
        return math.log(self.baseline) / y**2 if self.metric == "ppl" else 1.0

    def central(self, s: float) -> float:
        """The law's value at s without band or flags (accuracy clipped to [chance, 1])."""
        value = self._value(self._y(_check_sparsity(s))[0])
        return self._clip(value)[0]

    def _clip(self, value: float) -> tuple[float, bool]:
        """Accuracy lives in [chance, 1]; says whether the chance floor was hit."""
        if self.metric != "acc":
            return value, False
        floor = self.chance or 0.0
        return min(max(value, floor), 1.0), value < floor

    def predict(self, s: float, level: float = DEFAULT_LEVEL) -> Prediction:
        """Value, band at ``level`` and the flags that qualify them (extrapolation, prior, chance)."""
        s = _check_sparsity(s)
        z = _z(level)
        y, var_fit = self._y(s)
        flags: list[str] = []
        notes: list[str] = list(self.notes)
        measured = [p[0] for p in self.points]
        if measured and s > max(measured):
            flags.append("extrapolated")
            notes.append(
                f"extrapolated beyond the largest measured sparsity {max(measured):g} "
                f"by {s - max(measured):g}"
            )
        if measured and not self.form.anchored and s < min(measured):
            flags.append("below_measured")
            notes.append(
                f"below the smallest measured sparsity {min(measured):g}; the {self.law} law is not "
                "anchored at the dense point"
            )
        if self.band_from_prior:
            flags.append("band_from_prior")
            notes.append(
                f"band is a heuristic: sigma = {self.sigma:.1%} comes from the prior, the fit has no spare "
                "points to estimate it from residuals"
            )
        if self.metric == "ppl" and y <= 0.0:
            flags.append("diverged")
            notes.append("the law reaches ln PPL0 / ln PPL = 0 here: it predicts collapse, no finite value")
            return self._prediction(s, math.inf, (math.inf, math.inf), level, None, flags, notes)
        jac = self._jacobian(y)
        # new measurement: parameter variance plus one measurement's noise, in the linear space
        sd_y = math.sqrt(var_fit + (self.sigma / jac) ** 2)
        lo, hi = sorted((self._value(y - z * sd_y), self._value(y + z * sd_y)))
        value, clipped = self._clip(self._value(y))
        if self.metric == "acc":
            lo, hi = self._clip(lo)[0], self._clip(hi)[0]
        if clipped:
            flags.append("clipped_at_chance")
            notes.append(f"the law falls below chance ({self.chance:g}) here; clipped to chance")
        if math.isinf(hi):
            flags.append("band_unbounded")
        return self._prediction(s, value, (lo, hi), level, jac * sd_y, flags, notes)

    def _prediction(
        self,
        s: float,
        value: float,
        band: tuple[float, float],
        level: float,
        rel_error: float | None,
        flags: list[str],
        notes: list[str],
    ) -> Prediction:
        return Prediction(
            metric=self.metric,
            sparsity=s,
            value=value,
            baseline=self.baseline,
            band=band,
            level=level,
            expected_rel_error=rel_error,
            law=self.law,
            formula=self.form.formula,
            params=self.params,
            fitted_on=self.points,
            flags=tuple(flags),
            notes=tuple(notes),
        )


def _fit(
    metric: Metric,
    form: _Form,
    baseline: float,
    points: Sequence[Point],
    sigma0: float,
    chance: float | None = None,
) -> Fit:
    """Weighted least squares of ``form`` on ``points`` (see the module docstring for the weights)."""
    # rows of the weighted problem: sqrt(w) * design(s) . theta = sqrt(w) * (y - offset)
    rows: list[tuple[tuple[float, ...], float, float]] = []  # (design, target, weight)
    for s, value in points:
        if metric == "ppl":
            y = math.log(baseline) / math.log(value)  # r = ln PPL0 / ln PPL
            weight = (math.log(value) / y) ** 2  # (ln PPL0 / r**2)**2 == (ln PPL / r)**2
        else:
            y, weight = math.log(value / baseline), 1.0
        rows.append((form.design(s), y - form.offset, weight))
    p = len(form.param_names)
    xtwx = [[sum(w * d[i] * d[j] for d, _, w in rows) for j in range(p)] for i in range(p)]
    xtwy = [sum(w * d[i] * y for d, y, w in rows) for i in range(p)]
    inv = _inverse(xtwx)
    theta = [sum(inv[i][j] * xtwy[j] for j in range(p)) for i in range(p)]
    rss = sum(w * (y - sum(di * ti for di, ti in zip(d, theta, strict=True))) ** 2 for d, y, w in rows)
    dof = len(points) - p
    sigma = math.sqrt((PRIOR_DOF * sigma0**2 + rss) / (PRIOR_DOF + dof))
    return Fit(
        metric=metric,
        form=form,
        baseline=baseline,
        points=tuple(points),
        theta=tuple(theta),
        theta_cov=tuple(tuple(sigma**2 * c for c in row) for row in inv),
        sigma=sigma,
        band_from_prior=dof == 0,
        chance=chance,
    )


def _inverse(m: list[list[float]]) -> list[list[float]]:
    """Inverse of a 1x1 or 2x2 normal matrix (every law here has one or two parameters)."""
    if len(m) == 1:
        return [[1.0 / m[0][0]]]
    det = m[0][0] * m[1][1] - m[0][1] * m[1][0]
    if det <= 1e-12 * m[0][0] * m[1][1]:
        raise ValueError("the points cannot determine both parameters: measure two distinct sparsities")
    return [[m[1][1] / det, -m[0][1] / det], [-m[1][0] / det, m[0][0] / det]]


def _loo(
    metric: Metric, form: _Form, baseline: float, points: Sequence[Point], chance: float | None
) -> float | None:
    """RMS relative error predicting each point from the others; None when a fold cannot be fitted."""
    errors = []
    for i, (s, value) in enumerate(points):
        rest = [p for j, p in enumerate(points) if j != i]
        if len({p[0] for p in rest}) < len(form.param_names):
            return None
        predicted = _fit(metric, form, baseline, rest, 1.0, chance).central(s)
        errors.append(predicted / value - 1.0)
    return math.sqrt(sum(e * e for e in errors) / len(errors))


def _select(simple: Fit, affine: Fit | None, tolerance: float) -> tuple[Fit, str]:
    """Choose by leave-one-out error. With too few sparsities to cross-validate the affine law, keep
    the simpler anchored law unless it misses a calibration point by more than ``tolerance``, i.e.
    unless the data reject its anchoring at the dense point."""
    if affine is None:
        return simple, f"one pruned sparsity: only the one-parameter {simple.law} law can be fitted"
    if simple.loo_rel_error is not None and affine.loo_rel_error is not None:
        if affine.loo_rel_error < simple.loo_rel_error - 1e-9:  # a numerical tie is no evidence
            return affine, (
                f"leave-one-out error {affine.loo_rel_error:.1%} ({affine.law}) < "
                f"{simple.loo_rel_error:.1%} ({simple.law})"
            )
        return simple, (
            f"leave-one-out error {simple.loo_rel_error:.1%} ({simple.law}) <= "
            f"{affine.loo_rel_error:.1%} ({affine.law}); the simpler law wins ties"
        )
    miss = _quality(simple).max_ape
    prefix = f"fewer than three pruned sparsities, too few to cross-validate the {affine.law} law; "
    if miss > tolerance:
        return affine, prefix + (
            f"the anchored {simple.law} law misses a calibration point by {miss:.1%} (> {tolerance:.0%} "
            f"tolerance), so the data reject its anchoring and the {affine.law} law is used"
        )
    return simple, prefix + (
        f"the anchored {simple.law} law fits the points within {miss:.1%} (<= {tolerance:.0%} "
        "tolerance), so the simpler law is kept"
    )


def _quality(fit: Fit) -> FitQuality:
    return fit_quality([p[1] for p in fit.points], [fit.central(p[0]) for p in fit.points])


def _fit_and_select(
    metric: Metric,
    forms: tuple[_Form, _Form],
    baseline: float,
    points: list[Point],
    sigma0: float,
    tolerance: float,
    chance: float | None = None,
) -> tuple[Fit, tuple[Fit, ...], str, dict[str, FitQuality]]:
    """Fit the anchored form, and the affine one when there are two distinct sparsities; choose."""
    if not (math.isfinite(sigma0) and sigma0 > 0.0) or not (math.isfinite(tolerance) and tolerance >= 0.0):
        raise ValueError(f"sigma0 must be > 0 and tolerance >= 0, got sigma0={sigma0}, tolerance={tolerance}")
    usable = forms if len({p[0] for p in points}) >= 2 else forms[:1]
    fits = tuple(
        replace(fit, loo_rel_error=_loo(metric, form, baseline, points, chance))
        for form in usable
        for fit in [_fit(metric, form, baseline, points, sigma0, chance)]
    )
    chosen, reason = _select(fits[0], fits[1] if len(fits) > 1 else None, tolerance)
    return chosen, fits, reason, {fit.law: _quality(fit) for fit in fits}
