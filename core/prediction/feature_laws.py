"""Laws in a profile feature: ln PPL(s) - ln PPL0 = c * F(d(s)) ** beta (docs/science.md, "Predicting
before pruning").

beta is 1 (a *feature law*) or the exponent pooled from other curves (a *power law*, `fit_exponent`,
`pooled_exponent`); with beta fixed the law is linear in G = F^beta, and everything below is about c.

F is an aggregate of a dense profile (`core.profiles.FEATURES`): a discarded-energy share or a
summed logit-lens KL. One coefficient c per feature, model, method and protocol; the law passes
through the dense point (F = 0 at d = D). Pure Python, like `core.prediction.laws`.

Where c comes from, in order of what is known about the model:

- **no curve anywhere:** only the lens-KL sum has a meaning of its own (nats of NLL increase), so it
  answers with c = 1 and the prior spread `COEFFICIENT_SPREAD0`; the energy features cannot answer;
- **curves of other models or protocols, none of this one** (zero points): empirical Bayes over the
  per-curve coefficients c_m (`pool`): the prior mean is their mean, the between-curve variance
  tau^2 their variance less their own sampling variance, pooled with a prior spread of
  `COEFFICIENT_SPREAD0` (weight `PRIOR_CURVES` curves), so two similar curves do not claim that
  every model behaves like them;
- **pruned points of this model:** the posterior of c given the prior and the points (normal-normal,
  `posterior`), so one point moves c as far as its precision against tau allows; with no other
  curve to pool, c is fitted on the points alone (`from_points`).

The band is the normal interval in ln PPL: Var = F^2 Var(c) + sigma^2, sigma the spread of one
measured point about its curve's law, pooled over the curves' residuals with the prior
`core.prediction.laws.PPL_SIGMA0`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

from core.prediction.law_fitting import PRIOR_DOF
from core.prediction.law_prediction import DEFAULT_LEVEL
from core.prediction.laws import PPL_SIGMA0

COEFFICIENT_SPREAD0 = 0.5
"""Prior between-model spread of c, relative to its mean: a new model's coefficient is taken to lie
within about +-50 % (one sd) of the pooled one. An assumption, not a fit: it states that models of
other sizes and families may need a different c; the backtests report how it covers."""

EXPONENT_SPREAD0 = 0.1
"""Prior spread (one sd) of a new curve's beta about the pooled one. An assumption, like
`COEFFICIENT_SPREAD0`: it was set after the one-point bands were seen to under-cover without any
exponent spread (docs/science.md), so the coverage they reach with it is not an independent check."""

PRIOR_CURVES = 2.0
"""How many curves the prior spread is worth when pooled with the observed spread of the c_m."""

MIN_FEATURE = 1e-12
"""Below this a point carries no information about c (F = 0: nothing is discarded)."""


@dataclass(frozen=True)
class Coefficient:
    """c with its uncertainty, the within-curve sigma, and where they came from."""

    value: float
    sd: float  # of c itself
    sigma: float  # sd of one measured ln PPL about the law
    source: str
    curves: int = 0  # curves pooled into the prior
    points: int = 0  # own points in the posterior


@dataclass(frozen=True)
class CurveFit:
    """The least-squares c of one measured curve, through the dense point."""

    c: float
    se: float  # standard error of c from the curve's residuals (prior sigma when too few points)
    residual_sq: float  # sum of squared residuals in ln PPL
    dof: int  # points - 1


def fit_curve(points: Sequence[tuple[float, float]]) -> CurveFit:
    """c minimising sum (y - c F)^2 over (F, y) points, y = ln PPL - ln PPL0; ValueError if every
    F is 0."""
    usable = [(f, y) for f, y in points if f > MIN_FEATURE and math.isfinite(y)]
    if not usable:
        raise ValueError("no point with a positive feature: the profile says nothing was discarded")
    sff = math.fsum(f * f for f, _ in usable)
    c = math.fsum(f * y for f, y in usable) / sff
    residual_sq = math.fsum((y - c * f) ** 2 for f, y in usable)
    dof = len(usable) - 1
    sigma = pooled_sigma(residual_sq, dof)
    return CurveFit(c=c, se=sigma / math.sqrt(sff), residual_sq=residual_sq, dof=dof)


def pooled_sigma(residual_sq: float, dof: int) -> float:
    """sigma pooled from the prior PPL_SIGMA0 (worth PRIOR_DOF) and the residuals."""
    return math.sqrt((PRIOR_DOF * PPL_SIGMA0**2 + residual_sq) / (PRIOR_DOF + dof))


def fit_exponent(points: Sequence[tuple[float, float]]) -> float | None:
    """beta of y = c F^beta from (F, y) points: the slope of ln y on ln F, each point weighted by y^2
    (the delta method: a point's ln y has sd sigma / y); None without two points of distinct F."""
    usable = [(math.log(f), math.log(y), y * y) for f, y in points if f > MIN_FEATURE and y > 0.0]
    if len({x for x, _, _ in usable}) < 2:
        return None
    total = math.fsum(w for _, _, w in usable)
    mx = math.fsum(w * x for x, _, w in usable) / total
    my = math.fsum(w * y for _, y, w in usable) / total
    sxx = math.fsum(w * (x - mx) ** 2 for x, _, w in usable)
    return math.fsum(w * (x - mx) * (y - my) for x, y, w in usable) / sxx


@dataclass(frozen=True)
class Exponent:
    """beta with the spread a new curve's beta may have about it."""

    value: float
    sd: float


LINEAR = Exponent(1.0, 0.0)
"""A feature law's exponent: 1, exactly."""


def log_anchor(points: Sequence[tuple[float, float]]) -> float:
    """The mean ln F of the (F, y) points with F > 0 (0 when there is none)."""
    logs = [math.log(f) for f, _ in points if f > MIN_FEATURE]
    return math.fsum(logs) / len(logs) if logs else 0.0


def pooled_exponent(curves: Sequence[Sequence[tuple[float, float]]]) -> Exponent | None:
    """The mean beta of the curves that can give one (None when none can), and its spread for a new
    curve: the observed spread of the betas pooled with `EXPONENT_SPREAD0` (worth `PRIOR_CURVES`),
    plus the error of the mean."""
    betas = [beta for points in curves if (beta := fit_exponent(points)) is not None]
    if not betas:
        return None
    n = len(betas)
    mean = math.fsum(betas) / n
    observed = math.fsum((b - mean) ** 2 for b in betas) / (n - 1) if n > 1 else 0.0
    spread = (PRIOR_CURVES * EXPONENT_SPREAD0**2 + (n - 1) * observed) / (PRIOR_CURVES + n - 1)
    return Exponent(mean, math.sqrt(spread * (1.0 + 1.0 / n)))


def uncalibrated() -> Coefficient:
    """c = 1 with the prior spread: the lens-KL sum taken at face value."""
    return Coefficient(1.0, COEFFICIENT_SPREAD0, PPL_SIGMA0, "face value (c = 1), no measured curve")


def pool(fits: Sequence[CurveFit], source: str) -> Coefficient:
    """Empirical-Bayes prior for a curve not among `fits`: mean of the c_m; between-curve variance
    (observed, less the sampling variance, floored at 0) pooled with the prior spread."""
    if not fits:
        raise ValueError("no curve to pool")
    cs = [fit.c for fit in fits]
    n = len(cs)
    mean = math.fsum(cs) / n
    sampling = math.fsum(fit.se**2 for fit in fits) / n
    prior_var = (COEFFICIENT_SPREAD0 * abs(mean)) ** 2
    observed = math.fsum((c - mean) ** 2 for c in cs) / (n - 1) if n > 1 else 0.0
    between = max(observed - sampling, 0.0)
    tau_sq = (PRIOR_CURVES * prior_var + (n - 1) * between) / (PRIOR_CURVES + n - 1)
    tau_sq += (tau_sq + sampling) / n  # a new curve's c = its own deviation + the mean's error
    residual_sq = math.fsum(fit.residual_sq for fit in fits)
    sigma = pooled_sigma(residual_sq, sum(fit.dof for fit in fits))
    return Coefficient(mean, math.sqrt(tau_sq), sigma, source, curves=len(fits))


def from_points(points: Sequence[tuple[float, float]], source: str) -> Coefficient:
    """c from the curve's own (F, y) points alone (a flat prior): its least-squares value and
    standard error; ValueError when no point has F > 0."""
    fit = fit_curve(points)
    sigma = pooled_sigma(fit.residual_sq, fit.dof)
    usable = sum(1 for f, y in points if f > MIN_FEATURE and math.isfinite(y))
    return Coefficient(fit.c, fit.se, sigma, source, points=usable)


def posterior(prior: Coefficient, points: Sequence[tuple[float, float]]) -> Coefficient:
    """c given the prior and the model's own (F, y) points (normal prior, normal errors of sd
    prior.sigma): precision-weighted. Points with F = 0 carry nothing and are skipped."""
    usable = [(f, y) for f, y in points if f > MIN_FEATURE and math.isfinite(y)]
    if not usable:
        return prior
    precision_prior = 1.0 / max(prior.sd, 1e-12) ** 2
    sff = math.fsum(f * f for f, _ in usable) / prior.sigma**2
    sfy = math.fsum(f * y for f, y in usable) / prior.sigma**2
    precision = precision_prior + sff
    value = (prior.value * precision_prior + sfy) / precision
    return Coefficient(
        value,
        1.0 / math.sqrt(precision),
        prior.sigma,
        f"{prior.source}, updated with {len(usable)} measured point(s) of this curve",
        curves=prior.curves,
        points=len(usable),
    )


@dataclass(frozen=True)
class FeaturePrediction:
    value: float  # predicted PPL
    band: tuple[float, float]
    level: float
    log_sd: float  # sd of the predicted ln PPL


def predict(
    ppl0: float,
    feature: float,
    coefficient: Coefficient,
    level: float = DEFAULT_LEVEL,
    exponent: Exponent = LINEAR,
    log_anchor: float = 0.0,
) -> FeaturePrediction:
    """PPL0 exp(c F^beta) with its band at `level`: the variance of ln PPL is (F^beta sd_c)^2 +
    sigma^2 + (c F^beta (ln F - log_anchor) sd_beta)^2. The last term is the exponent's spread
    (delta method) about `log_anchor`, the mean ln F of the points c was fitted on: there c is
    pinned by measurements whatever beta is, so a wrong beta costs in proportion to the distance."""
    if not (math.isfinite(ppl0) and ppl0 > 1.0):
        raise ValueError(f"dense perplexity must be a finite number > 1, got {ppl0}")
    if not (math.isfinite(feature) and feature >= 0.0):
        raise ValueError(f"feature must be finite and >= 0, got {feature}")
    z = NormalDist().inv_cdf(0.5 + level / 2.0)
    powered = feature**exponent.value
    centre = math.log(ppl0) + coefficient.value * powered
    slope = coefficient.value * powered * (math.log(feature) - log_anchor) if feature > MIN_FEATURE else 0.0
    log_sd = math.sqrt((powered * coefficient.sd) ** 2 + coefficient.sigma**2 + (slope * exponent.sd) ** 2)
    return FeaturePrediction(
        value=math.exp(centre),
        band=(math.exp(centre - z * log_sd), math.exp(centre + z * log_sd)),
        level=level,
        log_sd=log_sd,
    )
