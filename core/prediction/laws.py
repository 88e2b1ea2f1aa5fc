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
  two-parameter affine form; the one with the lower leave-one-out error is chosen. They are empirical
  fits, and every prediction says which points they saw;
- a **prior accuracy slope** when no pruned accuracy was measured, flagged as such.

This module names the laws, their priors and tolerances, and calibrates them (`Calibration`). The
least squares, the error model and the choice between forms are `core.prediction.law_fitting`; what a
prediction holds and the checks on a law's inputs are `core.prediction.law_prediction`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from statistics import stdev

from core.prediction.law_fitting import Fit, _fit_and_select, _Form
from core.prediction.law_prediction import (
    DEFAULT_LEVEL,
    FitQuality,
    Metric,
    Point,
    Prediction,
    _check_acc,
    _check_points,
    _check_ppl,
    _check_sparsity,
    _exp_or_inf,
    fit_quality,
)

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
