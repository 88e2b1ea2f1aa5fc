"""Laws that predict a pruned model's perplexity and accuracy from its dense baseline (docs/science.md §2).

Pure math on the standard library alone (no numpy, no torch, no I/O): the problems have one or two
parameters and a handful of points, where plain floats are faster than arrays, and the API process
can import this without the engine's dependencies.

Three kinds of answer, in order of how much they know:

- the **strict perplexity law** PPL(s) = PPL0 ** (1 / (1 - s)) (Xu et al. 2025) needs only the dense
  perplexity; it has no fitted parameters, so it carries no band, and on the published SliceGPT
  numbers it over-predicts by 11-157 % at 10-30 % slicing (see tests);
- **calibrated laws**, fitted by weighted least squares to measured pruned points of the same model,
  method and protocol. Each family has a one-parameter form anchored at the dense point and a
  two-parameter affine form; the one with the lower leave-one-out error is chosen (rules in
  ``_select``). They are empirical fits, and every prediction says which points they saw;
- a **prior accuracy slope** when no pruned accuracy was measured, flagged as such.

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
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from statistics import NormalDist, stdev
from typing import Literal

Point = tuple[float, float]
"""(sparsity, measured value): perplexity (> 1) or accuracy (in (0, 1])."""

Metric = Literal["ppl", "acc"]

DEFAULT_LEVEL = 0.95
"""Coverage of the band around each prediction (normal approximation, no t quantiles)."""

PPL_SIGMA0 = 0.03
"""Prior relative error of one perplexity measurement about a calibrated law. Provenance: the affine
law fitted to all four published SliceGPT points (10-30 %, docs/science.md §1) leaves residuals of 2.7 %
(OPT-125M) and 1.9 % (Llama-2-7B) root mean square in ln PPL; 3 % rounds the larger one up because a
new model, method or protocol is less well known than those curves. The same series are the held-out
check in the tests, so that check is not independent of this constant."""

ACC_SIGMA0 = 0.03
"""Prior relative error of one accuracy measurement about its law. An assumption, not a fit: it is the
binomial standard error of an accuracy near 0.5 on about 300 questions, a small task of the
lm-evaluation-harness kind. Callers with the measured stderr should pass it."""

PRIOR_DOF = 2.0
"""How many residual degrees of freedom the prior sigma0 is worth when pooled with the residuals: two
spare points weigh as much as the prior, more points outweigh it."""

PPL_TOLERANCE = 0.01
"""With exactly two pruned sparsities the two-parameter law cannot be cross-validated, so it is
chosen only when the anchored one-parameter law misses a calibration point by more than this
relative error, i.e. when the data reject the anchoring. Assumption: a perplexity measured under a
fixed protocol reproduces to better than 1 %."""

ACC_TOLERANCE = 0.03
"""The same threshold for accuracy, looser because accuracies are noisy (see ``ACC_SIGMA0``)."""


@dataclass(frozen=True)
class PriorSlope:
    """A prior for k in ln(acc / acc0) = -k * s, used when no pruned accuracy was measured."""

    k: float
    sd: float
    source: str

    def __post_init__(self) -> None:
        if not (math.isfinite(self.k) and math.isfinite(self.sd) and self.sd >= 0.0):
            raise ValueError(
                f"prior slope needs a finite k and a finite sd >= 0, got k={self.k}, sd={self.sd}"
            )


DEFAULT_ACC_PRIOR = PriorSlope(
    k=0.35,
    sd=0.35,
    source=(
        "default constant: SliceGPT (Ashkboos et al. 2024, abstract) keeps about 90 % of Phi-2's and "
        "99 % of Llama-2-70B's dense zero-shot accuracy at 30 % slicing, k = -ln(0.90) / 0.3 = 0.35 and "
        "-ln(0.99) / 0.3 = 0.03; we take the steeper one with sd = k because small models degrade "
        "faster. Order of magnitude only: prefer a slope pooled over measured models and tasks"
    ),
)


@dataclass(frozen=True)
class FitQuality:
    """How well a law's values match measured ones: R² (None when undefined) and relative errors."""

    n: int
    r2: float | None
    max_ape: float
    mean_ape: float


@dataclass(frozen=True)
class Prediction:
    """A predicted value at one sparsity, with everything a response needs to be honest about it."""

    metric: Metric
    sparsity: float
    value: float
    baseline: float
    """The measured dense value (PPL0 or acc0) the law starts from."""
    band: tuple[float, float] | None
    """(lo, hi) at ``level``; None when the law has no error model (the strict law)."""
    level: float
    expected_rel_error: float | None
    """One standard deviation of the relative error of this prediction (grows with extrapolation)."""
    law: str
    formula: str
    params: dict[str, float]
    fitted_on: tuple[Point, ...]
    flags: tuple[str, ...] = ()
    """Machine-readable: extrapolated, below_measured, band_from_prior, prior, clipped_at_chance, ..."""
    notes: tuple[str, ...] = ()
    strict_law_errors: tuple[Point, ...] = ()
    """(s, relative error of the strict law) on each calibration point, for PPL calibrations."""


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


PPL_ALPHA = _Form("alpha", "ln PPL0 / ln PPL = 1 - alpha * s", ("alpha",), 1.0, lambda s: (-s,), True)
PPL_AFFINE = _Form(
    "affine", "ln PPL0 / ln PPL = a + b * (1 - s)", ("a", "b"), 0.0, lambda s: (1.0, 1.0 - s), False
)
ACC_SLOPE = _Form("slope", "ln(acc / acc0) = -k * s", ("k",), 0.0, lambda s: (-s,), True)
ACC_AFFINE = _Form(
    "affine", "ln(acc / acc0) = c + v * (1 - s)", ("c", "v"), 0.0, lambda s: (1.0, 1.0 - s), False
)
ACC_PRIOR = _Form("prior", ACC_SLOPE.formula, ("k",), 0.0, ACC_SLOPE.design, True)
STRICT_FORMULA = "PPL = PPL0 ** (1 / (1 - s))"


# ---------------------------------------------------------------------------------------- validation


def _check_sparsity(s: float, what: str = "sparsity") -> float:
    s = float(s)
    if not math.isfinite(s) or not 0.0 <= s < 1.0:
        raise ValueError(f"{what} must be in [0, 1) (fraction removed; 1 would remove everything), got {s}")
    return s


def _check_ppl(ppl: float, what: str = "perplexity") -> float:
    ppl = float(ppl)
    if not math.isfinite(ppl) or ppl <= 1.0:
        raise ValueError(f"{what} must be a finite number > 1 (exp of a mean NLL > 0), got {ppl}")
    return ppl


def _check_acc(acc: float, what: str = "accuracy") -> float:
    acc = float(acc)
    if not math.isfinite(acc) or not 0.0 < acc <= 1.0:
        raise ValueError(f"{what} must be a fraction in (0, 1] (not a percentage), got {acc}")
    return acc


def _check_points(points: Sequence[Sequence[float]], check: Callable[[float, str], float]) -> list[Point]:
    if len(points) == 0:
        raise ValueError("no measured pruned points: pass at least one (sparsity, value) pair")
    out: list[Point] = []
    for i, point in enumerate(points):
        if len(point) != 2:
            raise ValueError(f"point {i} has {len(point)} entries; expected (sparsity, value)")
        s = _check_sparsity(point[0], f"sparsity of point {i}")
        if s == 0.0:
            raise ValueError(f"point {i} is at s = 0, the dense model: pass it as the dense baseline")
        out.append((s, check(point[1], f"value of point {i}")))
    return out


def _z(level: float) -> float:
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), e.g. 0.95, got {level}")
    return NormalDist().inv_cdf(0.5 + level / 2.0)


# ---------------------------------------------------------------------------------------------- laws


def _exp_or_inf(exponent: float) -> float:
    """exp() that answers inf past float range: a diverging law is a flagged value, not a crash."""
    return math.exp(exponent) if exponent < 709.0 else math.inf


def strict_ppl(ppl0: float, s: float) -> float:
    """PPL0 ** (1 / (1 - s)): the paper's law, exact at s = 0 and diverging as s -> 1."""
    return _exp_or_inf(math.log(_check_ppl(ppl0, "dense perplexity PPL0")) / (1.0 - _check_sparsity(s)))


def predict_strict_ppl(ppl0: float, s: float) -> Prediction:
    """The strict law as a Prediction: no fitted parameters, so no band, and a note that says so."""
    return Prediction(
        metric="ppl",
        sparsity=_check_sparsity(s),
        value=strict_ppl(ppl0, s),
        baseline=float(ppl0),
        band=None,
        level=DEFAULT_LEVEL,
        expected_rel_error=None,
        law="strict",
        formula=STRICT_FORMULA,
        params={"ppl0": float(ppl0)},
        fitted_on=(),
        flags=("uncalibrated",),
        notes=(
            "strict law from the dense perplexity alone: no error estimate; on the published SliceGPT "
            "numbers (OPT-125M, Llama-2-7B) it over-predicts by 11-157 % at 10-30 % slicing. Measure "
            "one pruned point to calibrate.",
        ),
    )


def fit_quality(measured: Sequence[float], predicted: Sequence[float]) -> FitQuality:
    """R² and absolute percentage errors of ``predicted`` against ``measured`` (same order)."""
    if len(measured) != len(predicted):
        raise ValueError(f"mismatched lengths: {len(measured)} measured vs {len(predicted)} predicted values")
    if len(measured) == 0:
        raise ValueError("no points to assess: pass at least one measured value")
    y = [float(v) for v in measured]
    f = [float(v) for v in predicted]
    if not all(math.isfinite(v) and v != 0.0 for v in y):
        raise ValueError("measured values must be finite and non-zero (percentage errors divide by them)")
    ape = [abs(fi - yi) / abs(yi) for yi, fi in zip(y, f, strict=True)]
    mean = sum(y) / len(y)
    ss_tot = sum((yi - mean) ** 2 for yi in y)
    ss_res = sum((fi - yi) ** 2 for yi, fi in zip(y, f, strict=True))
    r2 = None if len(y) < 2 or ss_tot == 0.0 else 1.0 - ss_res / ss_tot
    return FitQuality(n=len(y), r2=r2, max_ape=max(ape), mean_ape=sum(ape) / len(ape))


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


@dataclass(frozen=True)
class Calibration:
    """A chosen law, the candidates it was chosen from, why, and how each matched the points."""

    metric: Metric
    baseline: float
    chosen: Fit
    candidates: tuple[Fit, ...]
    reason: str
    quality: dict[str, FitQuality]
    """Per law (candidates, plus ``strict`` for PPL), on the calibration points."""
    strict_law_errors: tuple[Point, ...] = ()
    notes: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()

    def predict(self, s: float, level: float = DEFAULT_LEVEL) -> Prediction:
        """The chosen law's prediction, with the selection reason and strict-law errors attached."""
        s = _check_sparsity(s)
        if s == 0.0:
            return Prediction(
                metric=self.metric,
                sparsity=0.0,
                value=self.baseline,
                baseline=self.baseline,
                band=(self.baseline, self.baseline),
                level=level,
                expected_rel_error=0.0,
                law="dense",
                formula="measured dense baseline",
                params={},
                fitted_on=(),
                flags=("measured",),
            )
        p = self._from_dense_short_of_first_point(self.chosen.predict(s, level), level)
        notes = (f"law chosen: {self.reason}", *self.notes, *p.notes)
        if self.strict_law_errors:
            errors = ", ".join(f"{err:+.0%} at s = {at:g}" for at, err in self.strict_law_errors)
            notes += (f"on the calibration points the strict law is off by {errors}",)
        return replace(
            p, flags=(*self.flags, *p.flags), notes=notes, strict_law_errors=self.strict_law_errors
        )

    @property
    def answers_from_dense(self) -> bool:
        """Whether every answer of this calibration starts at the dense value: an anchored law does by
        its form, an affine perplexity law by `_from_dense_short_of_first_point`; an affine accuracy
        law does not (its intercept is free short of its first fitted point)."""
        return self.chosen.form.anchored or self.metric == "ppl"

    def _from_dense_short_of_first_point(self, p: Prediction, level: float) -> Prediction:
        """A perplexity law not anchored at the dense point (the affine one, its intercept free) says
        nothing trustworthy short of its first fitted point: at s = 0 it can say 36 where the dense
        model measures 30, or fall below 30. There the answer is ln PPL interpolated between the
        dense point and the law at that first point (flag `interpolated_from_dense`), its band moved
        with it; a form fixed before anything scored it, with no constant of its own. Backtests and
        answers both call this, so the record scores what is answered."""
        if self.chosen.form.anchored or not self.answers_from_dense:
            return p
        first = min((point[0] for point in self.chosen.points), default=None)
        if first is None or not 0.0 < p.sparsity < first:
            return p
        at_first = self.chosen.predict(first, level).value
        if not (math.isfinite(at_first) and at_first > 0.0):
            return p
        value = self.baseline * (at_first / self.baseline) ** (p.sparsity / first)
        band = p.band
        if band is not None and math.isfinite(p.value) and p.value > 0.0:
            band = (band[0] * value / p.value, band[1] * value / p.value)
        return replace(p, value=value, band=band, flags=(*p.flags, "interpolated_from_dense"))


def calibrate_ppl(
    ppl0: float,
    points: Sequence[Sequence[float]],
    *,
    sigma0: float = PPL_SIGMA0,
    tolerance: float = PPL_TOLERANCE,
) -> Calibration:
    """Fit the calibrated PPL laws to measured (s, PPL) points of one model, method and protocol.

    Needs the dense PPL0 and at least one pruned point; the affine law needs two distinct sparsities,
    and is cross-validated from three.
    """
    ppl0 = _check_ppl(ppl0, "dense perplexity PPL0")
    pts = _check_points(points, _check_ppl)
    chosen, fits, reason, quality = _fit_and_select(
        "ppl", (PPL_ALPHA, PPL_AFFINE), ppl0, pts, sigma0, tolerance
    )
    strict = tuple((s, strict_ppl(ppl0, s) / v - 1.0) for s, v in pts)
    quality["strict"] = fit_quality([v for _, v in pts], [strict_ppl(ppl0, s) for s, _ in pts])
    return Calibration("ppl", ppl0, chosen, fits, reason, quality, strict)


def pool_slopes(slopes: Sequence[float], source: str) -> PriorSlope:
    """A prior from accuracy slopes k fitted on other models or tasks: their mean and spread.

    With one slope the spread is unknown, so sd = |k| (as wide as the default prior's).
    """
    ks = [float(k) for k in slopes]
    if not ks or not all(math.isfinite(k) for k in ks):
        raise ValueError("pool_slopes needs at least one finite slope")
    mean = sum(ks) / len(ks)
    sd = stdev(ks) if len(ks) >= 2 else abs(mean)
    return PriorSlope(k=mean, sd=max(sd, 0.05), source=f"pooled over {len(ks)} fitted slopes: {source}")


def calibrate_acc(
    acc0: float,
    points: Sequence[Sequence[float]],
    n_options: int,
    *,
    prior: PriorSlope | None = None,
    sigma0: float = ACC_SIGMA0,
    tolerance: float = ACC_TOLERANCE,
) -> Calibration:
    """Fit the accuracy laws for one model and task, or fall back to a prior slope.

    Points at or below chance (1 / n_options) are censored: the law cannot say how far below chance
    the model "would" be, so they carry no slope information and are left out (and noted). With no
    pruned point above chance, the prior slope is used (``prior``, else ``DEFAULT_ACC_PRIOR``).
    """
    acc0 = _check_acc(acc0, "dense accuracy acc0")
    if isinstance(n_options, bool) or not isinstance(n_options, int) or n_options < 2:
        raise ValueError(f"n_options must be an integer >= 2 (chance = 1 / n_options), got {n_options!r}")
    chance = 1.0 / n_options
    pts = _check_points(points, _check_acc) if len(points) else []
    usable = [p for p in pts if p[1] > chance]
    notes: list[str] = []
    flags: list[str] = []
    if acc0 <= chance:
        notes.append(f"dense accuracy {acc0:g} is at or below chance {chance:g}: no skill to lose")
    if len(usable) < len(pts):
        flags.append("censored_points")
        notes.append(f"left out {len(pts) - len(usable)} point(s) at or below chance {chance:g}")
    if not usable:
        prior = prior or DEFAULT_ACC_PRIOR
        fit = Fit(
            metric="acc",
            form=ACC_PRIOR,
            baseline=acc0,
            points=(),
            theta=(prior.k,),
            theta_cov=((prior.sd**2,),),
            sigma=sigma0,
            band_from_prior=True,
            chance=chance,
            notes=(
                f"no measured pruned accuracy above chance: prior slope k = {prior.k:g} ± {prior.sd:g} "
                f"({prior.source})",
            ),
        )
        return Calibration(
            "acc",
            acc0,
            fit,
            (fit,),
            "no pruned point to fit: prior slope",
            {},
            (),
            tuple(notes),
            (*flags, "prior"),
        )
    chosen, fits, reason, quality = _fit_and_select(
        "acc", (ACC_SLOPE, ACC_AFFINE), acc0, usable, sigma0, tolerance, chance
    )
    return Calibration("acc", acc0, chosen, fits, reason, quality, (), tuple(notes), tuple(flags))
