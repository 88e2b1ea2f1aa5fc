"""Each rung's answer at one sparsity (`core.prediction.rungs`), from what the store and the caller
hold: the measured point, the simulated curve, the profile's chosen feature law, the law; and the
strict law for reference. Each states its band (log-normal, never below PPL0 for perplexity) and the
verdict of its own record (docs/science.md §2, "One answer per sparsity").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from statistics import NormalDist

from app.services.prediction.law_values import predict
from app.services.prediction.profile_rung import BeforePruning
from app.services.prediction.series import PPL, Series, finite
from app.services.prediction.simulated import ANCHORED, FACE, SimulatedCurves
from app.services.prediction.simulated_scores import SimulatedScores
from core.methods import stored_method_entry
from core.prediction import priors
from core.prediction.anchoring import Anchor, fit_scale
from core.prediction.backtests import (
    CALIBRATED,
    LOSO,
    ONE_POINT,
    POOLED_ALPHA,
    STRICT,
    ZERO_CURVE,
    ZERO_MODEL,
    Curve,
    Score,
)
from core.prediction.bands import combined_sd, log_sd_of_band, lognormal_band
from core.prediction.laws import Calibration, strict_ppl
from core.prediction.records import MIN_POINTS, RELIABLE_FACTOR, Summary, Verdict, distance_rate, verdict
from core.prediction.registry import SIMULATION_BENCH
from core.prediction.rungs import STRICT as STRICT_RUNG
from core.prediction.rungs import Estimate, Rung

SAME_SPARSITY = 1e-9


@dataclass(frozen=True)
class Evidence:
    """What the rungs of one metric read: the series, the store's curves of the method and their
    records, the newest simulation and its record, and the profile's answer."""

    series: Series
    level: float
    calibration: Calibration | None
    curves: Sequence[Curve] = ()
    scores: dict[tuple[str, str], Score] | None = None
    simulation: SimulatedCurves | None = None
    simulation_records: dict[str, Score] | None = None
    before: BeforePruning | None = None
    simulated_scores: SimulatedScores | None = None  # accuracy: the simulation's task scores

    @property
    def ppl0(self) -> float:
        assert self.series.dense is not None
        return self.series.dense.value

    @property
    def new_model(self) -> bool:
        """No pruned point of this model under the asked protocol: judged on records over models."""
        return not self.series.pruned

    def score(self, predictor: str, mode: str) -> Score | None:
        return None if self.scores is None else self.scores.get((predictor, mode))


def estimates(evidence: Evidence, s: float) -> list[Estimate]:
    """Every rung's estimate at `s`, best first; the strict law last, for perplexity of slicing."""
    out = [measured(evidence, s), simulated(evidence, s)]
    if evidence.series.metric == PPL:
        out.append(profile(evidence, s))
    out.append(law(evidence, s))
    if evidence.series.metric == PPL and _strict_applies(evidence.series.method):
        out.append(strict(evidence, s))
    return out


# ------------------------------------------------------------------------------------------ measured


def measured(evidence: Evidence, s: float) -> Estimate:
    series = evidence.series
    points = [series.dense, *series.pruned] if series.dense is not None else list(series.pruned)
    hit = next((p for p in points if abs(p.sparsity - s) <= SAME_SPARSITY), None)
    whose = "your points hold" if series.source == "caller" else "the store holds"
    if hit is None:
        return _cannot(Rung.MEASURED, s, f"{whose} no point at this sparsity under this protocol")
    source = f"result {hit.result_id}" if hit.result_id is not None else "your point"
    what = Verdict("measured", f"measured: {source} ({series.selection})")
    return Estimate(Rung.MEASURED, s, hit.value, None, "measured", source, what)


# ----------------------------------------------------------------------------------------- simulated


def simulated(evidence: Evidence, s: float) -> Estimate:
    """The newest simulation's curve at s: anchored through the job's anchors when it ran them, else
    through the series' measured points at simulated sparsities, else its face value; between two
    simulated sparsities, interpolated in ln PPL. Accuracy: the simulation's task scores."""
    if evidence.series.metric != PPL:
        return _simulated_score(evidence, s)
    simulation = evidence.simulation
    if simulation is None:
        return _cannot(
            Rung.SIMULATED, s, "no simulation of this model, method and protocol: a `simulate` job"
        )
    curve, predictor, flags = _simulated_curve(evidence, simulation)
    point = _interpolated(curve, s, evidence.ppl0)
    if point is None:
        largest = max((p[0] for p in curve), default=0.0)
        return _cannot(
            Rung.SIMULATED,
            s,
            f"beyond the simulated sparsities (largest {largest:g}): simulate this one",
        )
    value, sampling_sd, between = point
    record_name = ANCHORED if predictor != FACE else FACE
    summary, what = _simulation_verdict(evidence, simulation, record_name)
    model_sd = 0.0 if simulation.exact else None
    if summary is not None and summary.sigma is not None and summary.points >= MIN_POINTS:
        model_sd = summary.sigma
    elif model_sd is None and evidence.series.method in SIMULATION_BENCH:
        model_sd = SIMULATION_BENCH[evidence.series.method].worst_log_error
    if model_sd is None:
        flags = (*flags, "band_sampling_only")
    if between:
        flags = (*flags, "interpolated")
    sd = combined_sd(sampling_sd, model_sd)
    band = None if sd is None else lognormal_band(value, sd, evidence.level, floor=evidence.ppl0)
    return Estimate(Rung.SIMULATED, s, value, band, predictor, simulation.describe, what, flags=flags)


def _simulated_curve(
    evidence: Evidence, simulation: SimulatedCurves
) -> tuple[list[tuple[float, float, float | None]], str, tuple[str, ...]]:
    """(sparsity, value, sampling log sd) points of the curve the rung answers from, its predictor's
    name and flags."""
    level = evidence.level
    if simulation.anchored:
        points: list[tuple[float, float, float | None]] = [
            (p.sparsity, p.value, None) for p in simulation.anchored if p.value is not None
        ]
        return points, f"{ANCHORED} at {', '.join(f'{a:g}' for a in simulation.anchors)}", ()
    face = [
        (p.sparsity, p.value, _sampling_sd(p.value, p.low, p.high, level)) for p in simulation.face if p.value
    ]
    ppl0 = evidence.ppl0
    anchors = [
        Anchor(m.sparsity, v, m.value)
        for m in evidence.series.pruned
        for at, v, _ in face
        if abs(at - m.sparsity) <= SAME_SPARSITY
    ]
    scale = fit_scale(anchors, ppl0) if anchors and not simulation.exact else None
    if scale is None:
        return face, FACE, ()
    anchored = [(at, scale.apply(at, v, ppl0), sd) for at, v, sd in face]
    where = ", ".join(f"{a.sparsity:g}" for a in scale.anchors)
    return anchored, f"{ANCHORED} through the measured points at {where}", ("anchored_on_measured",)


def _sampling_sd(value: float | None, low: float | None, high: float | None, level: float) -> float | None:
    if value is None or low is None or high is None:
        return None
    return log_sd_of_band(value, (low, high), level)


def _interpolated(
    curve: list[tuple[float, float, float | None]], s: float, ppl0: float
) -> tuple[float, float | None, bool] | None:
    """(value, sampling sd, interpolated?) at s, linear in ln PPL between neighbouring points (the
    dense point at 0); None beyond the largest simulated sparsity."""
    known = sorted([(0.0, ppl0, 0.0), *curve])
    for at, value, sd in known:
        if abs(at - s) <= SAME_SPARSITY:
            return value, sd, False
    for (a, va, sa), (b, vb, sb) in pairwise(known):
        if a < s < b:
            w = (s - a) / (b - a)
            value = math.exp((1 - w) * math.log(va) + w * math.log(vb))
            sd = combined_sd(None if sa is None else (1 - w) * sa, None if sb is None else w * sb)
            return value, sd, True
    return None


def _simulated_score(evidence: Evidence, s: float) -> Estimate:
    """A task score of the newest simulation compared with the series' dense score: at a simulated
    sparsity its value, between two (the dense score counting as s = 0) linear in s; the band is the
    task's sampling error, with the paired band for the every-doc score added where the score rests
    on a subset of the docs (normal, within [0, 1]), since no record yet says how far a simulated
    score falls from a measured one, except where the simulated model is the pruned model itself."""
    scores = evidence.simulated_scores
    if scores is None:
        return _cannot(
            Rung.SIMULATED,
            s,
            "no simulation scored this task against this dense score: a `simulate` job with `accuracy`",
        )
    assert evidence.series.dense is not None
    known = [(0.0, evidence.series.dense.value, None), *((a, v, e) for a, v, e in scores.points if a > 0)]
    point = _between(known, s)
    if point is None:
        largest = max(a for a, _, _ in known)
        return _cannot(Rung.SIMULATED, s, f"beyond the simulated sparsities (largest {largest:g})")
    value, stderr, between = point
    band = None
    if stderr is not None:
        half = NormalDist().inv_cdf(0.5 + evidence.level / 2) * stderr
        band = (max(0.0, value - half), min(1.0, value + half))
    flags = ("band_sampling_only", *(("interpolated",) if between else ()))
    if scores.exact:
        what = Verdict(
            "exact",
            "exact by construction: the simulated model is the pruned model itself (its masks or bases); "
            "the band is the task's sampling error (and, on a subset of the docs, the paired band for "
            "the every-doc score)",
        )
    else:
        what = Verdict(
            "unscored",
            "no record yet of simulated task scores against measured ones (the perplexity record does not "
            "carry over): measure one pruned point to check",
        )
    return Estimate(Rung.SIMULATED, s, value, band, f"{FACE} (task)", scores.describe, what, flags=flags)


def _between(
    known: list[tuple[float, float, float | None]], s: float
) -> tuple[float, float | None, bool] | None:
    """(value, stderr, interpolated) at s from (sparsity, value, stderr) points sorted by sparsity,
    linear in s between two; None outside them."""
    for at, value, stderr in known:
        if abs(at - s) <= SAME_SPARSITY:
            return value, stderr, False
    for (a, va, ea), (b, vb, eb) in pairwise(known):
        if a < s < b:
            w = (s - a) / (b - a)
            errors = [e for e, weight in ((ea, 1 - w), (eb, w)) if e is not None and weight > 0]
            stderr = max(errors) if errors else None
            return (1 - w) * va + w * vb, stderr, True
    return None


def _simulation_verdict(
    evidence: Evidence, simulation: SimulatedCurves, record: str
) -> tuple[Summary | None, Verdict]:
    score = (evidence.simulation_records or {}).get(record)
    summary = None if score is None else score.summary
    if summary is not None and summary.points >= MIN_POINTS:
        return summary, verdict(summary, new_model=evidence.new_model, what="simulations vs measured curves")
    if simulation.exact:
        return summary, Verdict(
            "exact",
            "exact by construction: the simulation runs the method's own pruned model (masks or bases), "
            "so it differs from measuring only by float rounding",
        )
    bench = SIMULATION_BENCH.get(evidence.series.method)
    if bench is None:
        return summary, Verdict(
            "unscored",
            "no record: this store holds no simulation beside a measured curve of the method, and the "
            "simulation is a proxy with no bound (measure one point to anchor it)",
        )
    return summary, Verdict(
        "reliable" if bench.worst_log_error <= math.log(RELIABLE_FACTOR) else "rough",
        f"bench record ({bench.source}): worst face-value miss x{math.exp(bench.worst_log_error):.3g} over "
        f"{bench.curves} curves of {bench.models} models; this store holds no simulation beside a "
        "measured curve yet",
        bench.models,
        bench.curves,
    )


# ------------------------------------------------------------------------------------------- profile


def profile(evidence: Evidence, s: float) -> Estimate:
    before = evidence.before
    if before is None:
        return _cannot(
            Rung.PROFILE,
            s,
            f"no stored profile of the model predicts {evidence.series.method}: a `profile` job",
        )
    answer = before.chosen_answer
    if answer is None:
        return _cannot(Rung.PROFILE, s, before.reason)
    value = next((v for v in answer.values if abs(v.sparsity - s) <= SAME_SPARSITY), None)
    if value is None or value.prediction is None:
        why = "not asked" if value is None else str(value.why_not)
        return _cannot(Rung.PROFILE, s, f"the profile cannot answer here: {why}")
    prediction = value.prediction
    band = lognormal_band(prediction.value, prediction.log_sd, evidence.level, floor=evidence.ppl0)
    source = (
        f"profile {before.profile.row.id} (job {before.profile.row.job_id}); c {answer.coefficient.source}"
    )
    return Estimate(Rung.PROFILE, s, prediction.value, band, answer.predictor, source, before.verdict)


# ----------------------------------------------------------------------------------------------- law


def law(evidence: Evidence, s: float) -> Estimate:
    """The calibrated law on the series' own points; without any (perplexity), the alpha law pooled
    over other models' curves of the method."""
    if evidence.calibration is not None:
        return _calibrated(evidence, evidence.calibration, s)
    if evidence.series.metric != PPL:
        return _cannot(Rung.LAW, s, "no pruned point to fit the law on")
    others = [
        priors.CurvePoints(c.model, c.label, c.ppl0, c.points)
        for c in evidence.curves
        if c.model != evidence.series.model
    ]
    prior = priors.pooled_alpha(others)
    if prior is None:
        return _cannot(
            Rung.LAW,
            s,
            f"no pruned point of this model and no other model's {evidence.series.method} curve in the store",
        )
    value, band = priors.predict(evidence.ppl0, prior, s, evidence.level)
    record = evidence.score(POOLED_ALPHA, ZERO_MODEL)
    what = verdict(None if record is None else record.summary, new_model=True)
    flags = () if band is not None else ("band_unknown",)
    predictor = f"{POOLED_ALPHA} (alpha = {prior.alpha:.3g})"
    return Estimate(Rung.LAW, s, finite(value), band, predictor, prior.source, what, flags=flags)


def _calibrated(evidence: Evidence, calibration: Calibration, s: float) -> Estimate:
    prediction = predict(calibration, s, evidence.level)
    name = f"{CALIBRATED}: {calibration.chosen.law}"
    fitted = ", ".join(f"s = {p[0]:g}" for p in calibration.chosen.points)
    source = f"fitted on {fitted}" if fitted else "the prior"
    if prediction is None or not math.isfinite(prediction.value):
        return _cannot(Rung.LAW, s, "the law has no finite value here (it diverges)", name)
    one_point = len(calibration.chosen.points) <= 1
    record = evidence.score(CALIBRATED, ONE_POINT if one_point else LOSO)
    what = verdict(None if record is None else record.summary, new_model=False, what="backtest")
    if evidence.series.metric != PPL:
        band = None if prediction.band is None else (prediction.band[0], prediction.band[1])
        return Estimate(Rung.LAW, s, prediction.value, band, name, source, what, flags=prediction.flags)
    own_sd = None
    if prediction.band is not None and all(math.isfinite(b) and b > 0 for b in prediction.band):
        own_sd = log_sd_of_band(prediction.value, prediction.band, evidence.level)
    flags = tuple(f for f in prediction.flags if f != "band_from_prior")
    value = prediction.value  # short of an affine law's first point: from dense (`Calibration.predict`)
    sd = own_sd
    if one_point:
        # One point pins one number; how far that carries is read off the one-point record.
        rate = None if record is None else distance_rate(record.points)
        distance = min((abs(s - p[0]) for p in calibration.chosen.points), default=s)
        sd = None if rate is None else max(own_sd or 0.0, rate * distance)
    if sd is None:
        return Estimate(Rung.LAW, s, value, None, name, source, what, flags=(*flags, "band_unknown"))
    band = lognormal_band(value, sd, evidence.level, floor=evidence.ppl0)
    return Estimate(Rung.LAW, s, value, band, name, source, what, flags=flags)


# -------------------------------------------------------------------------------------------- strict


def strict(evidence: Evidence, s: float) -> Estimate:
    try:
        value = strict_ppl(evidence.ppl0, s)
    except OverflowError:
        value = math.inf
    record = evidence.score(STRICT, ZERO_CURVE)
    what = verdict(None if record is None else record.summary, new_model=True)
    source = "PPL0 alone: PPL = PPL0 ** (1 / (1 - s)), shown for reference"
    return Estimate(STRICT_RUNG, s, finite(value), None, "strict law", source, what)


def _strict_applies(method: str) -> bool:
    entry = stored_method_entry(method)
    return entry is None or entry.strict_law_applies


# ------------------------------------------------------------------------------------------- helpers


def _cannot(rung: Rung | str, s: float, why: str, predictor: str = "") -> Estimate:
    return Estimate(rung, s, None, None, predictor, "", Verdict("unscored", why), why_not=why)
