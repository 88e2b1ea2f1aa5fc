"""Stored profiles as predictor input: the store's measured curves with their profile features, the
backtests over them, and the predictions a profile gives a model before it is pruned.

A curve is a stored perplexity fit (a `sweep`'s points and dense baseline); its features come from
the newest profile of the same model under the same calibration windows (`CALIBRATION_KEYS`), the
ones its method is predicted from (`METHOD_FEATURES`: slicing's spectra and lens readings, or a mask
rule's output errors). A fit without such a profile still scores the calibrated laws (and slicing's
strict law), not the feature laws.
Pure arithmetic over a few indexed reads (no torch); the curves and their backtests are computed
once per state of the store (`scored_curves`), not on every prediction.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from app.schemas.profiles import (
    BacktestList,
    BacktestPublic,
    BeforePruningPublic,
    CoefficientPublic,
    CurvePublic,
    FeaturePredictedPublic,
    LensPublic,
    LinearPublic,
    PredictorPublic,
    ProfilePublic,
    SignalPublic,
)
from app.schemas.records import summary_public, verdict_public
from app.services.series import finite
from app.services.store_state import StateCache, StoreState, store_state
from core.model_sources import ModelSourceError, resolve_model
from core.prediction import feature_laws, records
from core.prediction.backtests import (
    CALIBRATED,
    CROSS_METHOD,
    ONE_POINT,
    POOLED_ALPHA,
    STRICT,
    ZERO_CURVE,
    ZERO_MODEL,
    Curve,
    FeatureLaw,
    HeldOut,
    LawFit,
    Score,
    backtest,
    cross_method_prior,
    feature_predictor,
    law_coefficient,
    law_prior,
)
from core.prediction.records import Verdict, verdict
from core.prediction.registry import PROFILE_PREDICTORS
from core.profiles import (
    CALIBRATION_KEYS,
    METHOD_FEATURES,
    LensMeans,
    LinearErrors,
    SignalSpectrum,
    StoredProfile,
    sibling_methods,
)
from core.published import PUBLISHED
from core.settings import Settings
from core.tables import Fit, Profile

CalibrationKey = tuple[Any, ...]


def calibration_key(calibration: dict[str, Any] | None) -> CalibrationKey:
    """What identifies calibration windows: the `CALIBRATION_KEYS` values of a record."""
    calibration = calibration or {}
    return tuple(calibration.get(key) for key in CALIBRATION_KEYS)


def stored_profile(row: Profile) -> StoredProfile:
    signals = [
        SignalSpectrum(
            index=signal.position,
            kind=signal.kind,
            layer=signal.layer,
            eigenvalues=tuple(signal.eigenvalues),
            energy=tuple(signal.energy or ()),  # () reads the eigenvalues (in-sample)
            token_energy=tuple(signal.token_energy),
            lens={
                int(r["width"]): LensMeans(float(r["kl"]), float(r["kl_taylor"]), float(r["nll_increase"]))
                for r in signal.lens
            },
        )
        for signal in row.signals
    ]
    sparsities = tuple(float(s) for s in row.sparsities)
    linears = [
        LinearErrors(
            linear.layer,
            linear.name,
            linear.output_energy,
            {rule: tuple(values) for rule, values in linear.errors.items()},
            sparsities,
        )
        for linear in row.linears
    ]
    return StoredProfile(row, signals, linears)


_PROFILE_PARTS = (selectinload(Profile.signals), selectinload(Profile.linears))


def newest_profiles(
    session: Session, model_ids: Sequence[str] | None = None
) -> dict[tuple[str, CalibrationKey], StoredProfile]:
    """The newest profile per (model, calibration windows), for the given models (None: all)."""
    query = select(Profile).options(*_PROFILE_PARTS).order_by(Profile.id.desc())
    if model_ids is not None:
        query = query.where(Profile.model_id.in_(list(model_ids)))
    newest: dict[tuple[str, CalibrationKey], StoredProfile] = {}
    for row in session.scalars(query):
        key = (row.model_id, calibration_key(row.protocol.get("calibration")))
        if key not in newest:
            newest[key] = stored_profile(row)
    return newest


def find_profile(
    session: Session, settings: Settings, model: str, job_id: str | None, calibration: dict[str, Any]
) -> StoredProfile | None:
    """The newest profile of `model` (or of its resolved id) from `job_id` whose calibration record
    matches every non-null field of `calibration`."""
    ids = [model]
    with contextlib.suppress(ModelSourceError):  # an id no source resolves is matched as given
        ids.append(resolve_model(model, settings).model_id)
    query = select(Profile).options(*_PROFILE_PARTS).where(Profile.model_id.in_(ids))
    if job_id is not None:
        query = query.where(Profile.job_id == job_id)
    for row in session.scalars(query.order_by(Profile.id.desc())):
        recorded = row.protocol.get("calibration", {})
        if all(value is None or recorded.get(key) == value for key, value in calibration.items()):
            return stored_profile(row)
    return None


def curve_label(fit: Fit) -> str:
    """A curve's name: model, method, calibration windows and perplexity protocol."""
    calibration = fit.protocol.get("calibration")
    windows = fit.protocol.get("max_windows") or "all"
    published = "published: " if fit.protocol.get("source") == PUBLISHED else ""
    calibrated = (
        "no calibration"  # magnitude pruning reads no data
        if not calibration
        else f"calibration {calibration.get('corpus')} {calibration.get('num_sequences')}x"
        f"{calibration.get('seqlen')} seed {calibration.get('seed')}"
    )
    return (
        f"{published}{fit.model_id} / {fit.method} / {calibrated} / "
        f"{fit.dataset} seqlen {fit.protocol.get('seqlen')} windows {windows}"
    )


def store_curves(session: Session, method: str) -> list[Curve]:
    """Every stored perplexity fit of `method` as a curve (the newest per label), with the features
    of its model's matching profile when there is one that predicts `method`."""
    fits = session.scalars(
        select(Fit).where(Fit.method == method, Fit.metric == "ppl").order_by(Fit.id.desc())
    ).all()
    profiles = newest_profiles(session, sorted({fit.model_id for fit in fits}))
    curves: dict[str, Curve] = {}
    for fit in fits:
        label = curve_label(fit)
        if label in curves:
            continue
        points = tuple(
            (float(p["sparsity"]), float(p["value"]))
            for p in fit.points
            if p.get("used") and float(p["sparsity"]) > 0.0 and p.get("value") is not None
        )
        if not points or not (math.isfinite(fit.baseline) and fit.baseline > 1.0):
            continue
        calibration = calibration_key(fit.protocol.get("calibration"))
        profile = _profile_for(profiles, fit.model_id, calibration)
        features = {} if profile is None else _features_at(profile, method, [s for s, _ in points])
        curves[label] = Curve(label, fit.model_id, method, fit.baseline, points, features, calibration)
    return list(curves.values())


NO_CALIBRATION: CalibrationKey = calibration_key(None)
"""The calibration key of a curve whose method reads no data (magnitude): any profile of its model
measures its masks, which depend on the weights alone."""


def matches_profile(curve_calibration: CalibrationKey, profile_calibration: CalibrationKey) -> bool:
    """True when a curve's points were pruned with the windows a profile was made on (or read none)."""
    return curve_calibration in (profile_calibration, NO_CALIBRATION)


def _profile_for(
    profiles: dict[tuple[str, CalibrationKey], StoredProfile], model: str, calibration: CalibrationKey
) -> StoredProfile | None:
    """The profile of `model` made on the curve's calibration windows; for a curve that read no
    data, the model's newest profile."""
    if calibration != NO_CALIBRATION:
        return profiles.get((model, calibration))
    own = [profile for (owner, _), profile in profiles.items() if owner == model]
    return max(own, key=lambda profile: profile.row.id, default=None)


BACKTEST_CACHE_SIZE = 32
"""(store state, method, level) entries of `scored_curves` kept per process."""

_scored = StateCache(BACKTEST_CACHE_SIZE)


@dataclass(frozen=True)
class ScoredCurves:
    """A method's curves, the curves of its sibling methods (`core.profiles.sibling_methods`: the
    cross-method pooling trains on them), and the backtests over the method's curves."""

    curves: list[Curve]
    siblings: list[Curve]
    scores: list[Score]


def scored_curves(
    session: Session, method: str, level: float, state: StoreState | None = None
) -> ScoredCurves:
    """`store_curves` of the method and its siblings and their `backtest`, computed once per state of
    the store (`app.services.store_state`)."""
    state = store_state(session) if state is None else state

    def compute() -> ScoredCurves:
        curves = store_curves(session, method)
        others = [curve for sibling in sibling_methods(method) for curve in store_curves(session, sibling)]
        return ScoredCurves(curves, others, backtest(curves, siblings=others, level=level))

    return _scored.get((state, method, level), compute)


def _features_at(
    profile: StoredProfile, method: str, sparsities: Sequence[float]
) -> dict[str, tuple[float, ...]]:
    """Each of `method`'s features at each sparsity; a feature the profile cannot give at some
    sparsity (outside the profiled range), or at all, is left out."""
    if not profile.offers(method):
        return {}
    features = {}
    for name in METHOD_FEATURES[method].names:
        try:
            features[name] = tuple(profile.feature(method, name, s) for s in sparsities)
        except ValueError:
            continue
    return features


# ------------------------------------------------------------------------------- before pruning


@dataclass(frozen=True)
class ProfileValue:
    """A feature law's answer at one sparsity, or why the profile cannot give it there."""

    sparsity: float
    feature: float | None  # F^beta
    prediction: feature_laws.FeaturePrediction | None
    why_not: str | None = None


@dataclass(frozen=True)
class PredictorAnswer:
    """One feature law's predictions for a model, with its coefficient and backtest record."""

    predictor: str
    feature: str
    description: str
    power: bool  # a power law (beta pooled from other curves), else a feature law (beta = 1)
    exponent: feature_laws.Exponent  # beta of c F^beta, with its spread
    coefficient: feature_laws.Coefficient
    backtest: Score | None
    values: list[ProfileValue]


@dataclass(frozen=True)
class BeforePruning:
    profile: StoredProfile
    method: str
    own_points: int
    mode: str  # the backtest mode that matches what is known of this model
    predictors: list[PredictorAnswer]
    chosen: str | None
    reason: str
    verdict: Verdict  # how far the chosen answer can be trusted, from its backtest record
    level: float = 0.95

    @property
    def chosen_answer(self) -> PredictorAnswer | None:
        return next((a for a in self.predictors if a.predictor == self.chosen), None)


def predict_before_pruning(
    session: Session,
    model_ids: Sequence[str],
    method: str,
    ppl0: float,
    sparsities: Sequence[float],
    level: float,
    calibration: dict[str, Any] | None = None,
    points: Sequence[tuple[float, float]] = (),
    state: StoreState | None = None,
) -> BeforePruning | None:
    """The feature laws' predictions for the newest profile of the model that predicts `method` and
    whose calibration record matches every non-null field of `calibration` (None without one): each
    coefficient pooled from the store's other curves (other models, and this model under other
    calibrations), updated with this model's own points: its stored curve under the profile's
    calibration, else `points` (the caller's, or the prune jobs' of the asked protocol). The method's
    pre-registered predictor (`core.prediction.registry`) is the answer, judged on its record in the
    mode that matches what is known (`_known_mode`); the others stay visible beside it."""
    wanted = {key: value for key, value in (calibration or {}).items() if value is not None}
    profiles = [
        p
        for p in newest_profiles(session, model_ids).values()
        if p.offers(method) and all(p.calibration.get(key) == value for key, value in wanted.items())
    ]
    if not profiles:
        return None
    profile = max(profiles, key=lambda p: p.row.id)
    entry = METHOD_FEATURES[method]
    scored = scored_curves(session, method, level, state)
    model = profile.row.model_id
    own_key = calibration_key(profile.calibration)
    own_curves = [c for c in scored.curves if c.model == model and matches_profile(c.calibration, own_key)]
    own_curve = own_curves[0] if own_curves else _points_curve(profile, method, ppl0, points)
    others = [c for c in scored.curves if c not in own_curves]
    scores = {(s.predictor, s.mode): s for s in scored.scores}
    registered = PROFILE_PREDICTORS.get(method)
    predictor = None if registered is None else feature_predictor(registered.feature)
    mode = _known_mode(model, own_curve, others, scored.siblings, scores, predictor)
    answers = []
    for law in (FeatureLaw(name, power) for name in entry.names for power in (False, True)):
        fit = law_prior(law, others)
        if mode == CROSS_METHOD:
            # The model's sensitivity under its other methods, where a chain of curves links them.
            fit = cross_method_prior(law, [*others, *scored.siblings], method, model) or fit
        if fit is None:
            continue
        own, anchor = [], fit.log_anchor  # c is pinned where its points are: the model's own, if any
        if own_curve is not None and law.feature in own_curve.features:
            own = own_curve.feature_points(law.feature, exponent=fit.exponent.value)
            anchor = feature_laws.log_anchor(own_curve.feature_points(law.feature))
        coefficient = law_coefficient(fit, own, f"fitted on this curve's {len(own)} point(s)")
        if coefficient is None:
            continue
        values = _profile_values(profile, method, law, fit, coefficient, anchor, ppl0, sparsities, level)
        if all(v.prediction is None for v in values) and sparsities:
            continue  # the profile cannot give this feature at all (e.g. no lens readings)
        answers.append(
            PredictorAnswer(
                law.predictor,
                law.feature,
                entry.description(law.feature),
                law.power,
                fit.exponent,
                coefficient,
                scores.get((law.predictor, mode)),
                values,
            )
        )
    chosen, reason, record = _registered(answers, scores, mode, method, profile)
    if not answers:
        reason = (
            f"no measured {method} curve of a profiled model in the store to learn the laws' coefficients "
            f"from: sweep {method} on a model and profile it under the sweep's calibration"
        )
    own_points = 0 if own_curve is None else len(own_curve.points)
    if chosen is not None and mode in CHOSEN_MODES and _both_possible(model, others, scored.siblings):
        record = nested_choice_score(scores, chosen, level)
    trust = verdict(None if record is None else record.summary, new_model=mode in NEW_MODEL_MODES)
    return BeforePruning(profile, method, own_points, mode, answers, chosen, reason, trust, level)


def _points_curve(
    profile: StoredProfile, method: str, ppl0: float, points: Sequence[tuple[float, float]]
) -> Curve | None:
    """The model's own points of the asked protocol (the caller's, or its prune jobs') as a curve
    the profile's features are read at; None without points."""
    if not points:
        return None
    model = profile.row.model_id
    label = f"{model} / {method} / the asked protocol's points"
    features = _features_at(profile, method, [s for s, _ in points])
    calibration = calibration_key(profile.calibration)
    return Curve(label, model, method, ppl0, tuple(sorted(points)), features, calibration)


PROFILE_ANSWER_CACHE_SIZE = 256
_answers = StateCache(PROFILE_ANSWER_CACHE_SIZE)


def cached_before_pruning(
    session: Session,
    state: StoreState,
    model_ids: Sequence[str],
    method: str,
    ppl0: float,
    sparsities: Sequence[float],
    level: float,
    calibration: dict[str, Any] | None,
    points: Sequence[tuple[float, float]],
) -> BeforePruning | None:
    """`predict_before_pruning`, once per state of the store and question: the profile's rows are
    the heaviest read a prediction makes."""
    wanted = tuple(sorted((key, value) for key, value in (calibration or {}).items() if value is not None))
    key = (state, tuple(model_ids), method, ppl0, tuple(sparsities), level, wanted, tuple(points))
    return _answers.get(
        key,
        lambda: predict_before_pruning(
            session, model_ids, method, ppl0, sparsities, level, calibration, points, state
        ),
    )


def _profile_values(
    profile: StoredProfile,
    method: str,
    law: FeatureLaw,
    fit: LawFit,
    coefficient: feature_laws.Coefficient,
    anchor: float,
    ppl0: float,
    sparsities: Sequence[float],
    level: float,
) -> list[ProfileValue]:
    """One law's answer at each sparsity, or why the profile cannot give it there."""
    values = []
    for s in sparsities:
        try:
            f = profile.feature(method, law.feature, s) if s > 0 else 0.0
        except ValueError as error:  # a width or sparsity outside the profiled range
            values.append(ProfileValue(s, None, None, str(error)))
            continue
        prediction = feature_laws.predict(ppl0, f, coefficient, level, fit.exponent, anchor)
        values.append(ProfileValue(s, f**fit.exponent.value, prediction))
    return values


NEW_MODEL_MODES = (ZERO_MODEL, CROSS_METHOD)


def _both_possible(model: str, others: Sequence[Curve], siblings: Sequence[Curve]) -> bool:
    """Whether carrying over and pooling could both answer for a model with no curve of the method."""
    return any(c.model != model for c in others) and any(c.model == model for c in siblings)


"""The modes of a model with no curve of the method: judged only on records over other models."""


def _known_mode(
    model: str,
    own_curve: Curve | None,
    others: Sequence[Curve],
    siblings: Sequence[Curve],
    scores: dict[tuple[str, str], Score],
    predictor: str | None,
) -> str:
    """The backtest mode that matches what the store knows of the model: points of its own under the
    profile's calibration, curves of the method under other calibrations, curves of sibling methods
    (carried over by `core.prediction.cross_method`), or none (pooled over other models). Where both carrying
    over and pooling can answer, the one whose record for `predictor` is better answers (carrying
    over, which uses more of what is known, while neither is scored): the model has no curve of the
    method, so these records never saw it; the verdict then reads the nested record of that choice
    (`NESTED_MODE`), never the record that made it."""
    if own_curve is not None:
        return ONE_POINT
    if any(c.model == model for c in others):
        return ZERO_CURVE
    if not any(c.model == model for c in siblings):
        return ZERO_MODEL
    if not any(c.model != model for c in others) or predictor is None:
        return CROSS_METHOD
    candidates = _mode_records(scores, predictor)
    return (
        records.choose(candidates, exclude_model=model) or CROSS_METHOD
    )  # unscored: use more of what is known


CHOSEN_MODES = (CROSS_METHOD, ZERO_MODEL)
NESTED_MODE = "zero-points, carried over or pooled, chosen nested"


def _mode_records(scores: dict[tuple[str, str], Score], predictor: str) -> dict[str, tuple[HeldOut, ...]]:
    """`predictor`'s held-out points in each mode `_known_mode` chooses between."""
    return {mode: scores[(predictor, mode)].points for mode in CHOSEN_MODES if (predictor, mode) in scores}


def nested_choice_score(scores: dict[tuple[str, str], Score], predictor: str, level: float) -> Score:
    """The record of `_known_mode`'s choice between carrying over and pooling for `predictor`."""
    candidates = _mode_records(scores, predictor)
    return Score(predictor, NESTED_MODE, level, tuple(records.nested(candidates)))


def _registered(
    answers: list[PredictorAnswer],
    scores: dict[tuple[str, str], Score],
    mode: str,
    method: str,
    profile: StoredProfile,
) -> tuple[str | None, str, Score | None]:
    """The method's pre-registered predictor (`core.prediction.registry`), why, and its record in
    `mode` (None: not scored there). Never the best of several on the points that judge it."""
    registered = PROFILE_PREDICTORS.get(method)
    if registered is None:
        return None, f"no profile predictor is registered for {method}", None
    name = feature_predictor(registered.feature)
    answer = next((a for a in answers if a.predictor == name), None)
    if answer is None:
        missing = (
            "the profile has no lens readings (it was made with lens_tokens 0): profile again with them"
            if registered.feature.startswith("lens") and METHOD_FEATURES[method].rule is None
            else f"the profile cannot give {registered.feature} at every asked sparsity (outside its "
            f"profiled range {profile.row.sparsities})"
        )
        return None, f"the registered predictor ({name}) cannot answer: {missing}", None
    source = answer.coefficient.source
    return (
        name,
        f"pre-registered for {method}: {registered.reason}; its coefficient: {source}",
        scores.get((name, mode)),
    )


# ------------------------------------------------------------------------------------- public


def profile_public(profile: StoredProfile, *, spectra: bool = False, linears: bool = False) -> ProfilePublic:
    """A stored profile as the API shows it: discarded shares and lens readings at its widths, and
    the mask-error features at its sparsities."""
    row = profile.row
    signals = []
    for signal, stored in zip(profile.signals, row.signals, strict=True):
        signals.append(
            SignalPublic(
                position=signal.index,
                name=signal.name,
                kind=signal.kind,
                layer=signal.layer,
                discarded=[signal.discarded(d) for d in row.widths],
                token_discarded=[signal.token_discarded(d) for d in row.widths],
                lens=[LensPublic(**reading) for reading in stored.lens],
                eigenvalues=list(signal.eigenvalues) if spectra else None,
                energy=list(signal.energy) if spectra else None,
                token_energy=list(signal.token_energy) if spectra else None,
            )
        )
    protocol = {key: value for key, value in row.protocol.items() if key not in ("calibration", "round_to")}
    return ProfilePublic(
        id=row.id,
        job_id=row.job_id,
        model=row.model_id,
        model_revision=row.model_revision,
        family=row.family,
        hidden_size=row.hidden_size,
        num_layers=row.num_layers,
        calibration=profile.calibration,
        round_to=profile.round_to,
        sparsities=row.sparsities,
        widths=row.widths,
        protocol=protocol,
        created_at=row.created_at,
        signals=signals,
        mask_features={
            method: {name: [profile.feature(method, name, s) for s in row.sparsities] for name in entry.names}
            for method, entry in METHOD_FEATURES.items()
            if entry.rule is not None and profile.offers(method)
        },
        linears=[LinearPublic.model_validate(linear, from_attributes=True) for linear in row.linears]
        if linears
        else None,
    )


def rung_of(predictor: str) -> str:
    """The rung a backtested predictor answers as."""
    if predictor.startswith("simulated"):
        return "simulated"
    if predictor == STRICT:
        return "strict"
    if predictor in (CALIBRATED, POOLED_ALPHA):
        return "law"
    return "profile"


def score_public(score: Score, *, points: bool = False) -> BacktestPublic:
    return BacktestPublic(
        rung=rung_of(score.predictor),
        predictor=score.predictor,
        mode=score.mode,
        level=score.level,
        n=score.n,
        curves=len({p.curve for p in score.points}),
        record=summary_public(score.summary),
        mape=finite(score.mape),
        max_ape=finite(score.max_ape),
        coverage=score.coverage,
        points=[
            {
                "curve": p.curve,
                "sparsity": p.sparsity,
                "measured": p.measured,
                "predicted": finite(p.predicted),  # null: the law overflows a float there
                "band": None if p.band is None else [finite(v) for v in p.band],
                "ape": finite(p.ape),
                "covered": p.covered,
                "fitted_on": p.fitted_on,
            }
            for p in score.points
        ]
        if points
        else None,
    )


def backtest_list(
    session: Session,
    method: str,
    level: float,
    *,
    points: bool = False,
    extra: Sequence[Score] = (),
    state: StoreState | None = None,
) -> BacktestList:
    """Every predictor in every mode over the store's curves of `method`, and `extra` records (the
    simulated rung's, the nested choice's)."""
    scored = scored_curves(session, method, level, state)
    curves = scored.curves
    return BacktestList(
        method=method,
        level=level,
        curves=[
            CurvePublic(
                label=c.label,
                model=c.model,
                method=c.method,
                ppl0=c.ppl0,
                points=[[s, v] for s, v in c.points],
                features=sorted(c.features),
            )
            for c in curves
        ],
        items=[score_public(score, points=points) for score in [*extra, *scored.scores] if score.n],
    )


def _sliced_width(profile: StoredProfile, method: str, sparsity: float) -> int | None:
    """The width slicing keeps at `sparsity` (None for a mask method, or where nothing would be kept:
    a small model at a large sparsity, whose prediction then says why not)."""
    if METHOD_FEATURES[method].rule is not None:
        return None
    try:
        return profile.width(sparsity)
    except ValueError:
        return None


def before_pruning_public(answer: BeforePruning) -> BeforePruningPublic:
    profile = answer.profile
    return BeforePruningPublic(
        profile_id=profile.row.id,
        profile_job_id=profile.row.job_id,
        calibration=profile.calibration,
        features_from=METHOD_FEATURES[answer.method].note,
        own_points=answer.own_points,
        mode=answer.mode,
        chosen=answer.chosen,
        reason=answer.reason,
        verdict=verdict_public(answer.verdict),
        predictors=[
            PredictorPublic(
                predictor=a.predictor,
                feature=a.feature,
                description=a.description,
                formula="ln PPL - ln PPL0 = c * F" + (" ** beta" if a.power else ""),
                exponent=a.exponent.value,
                exponent_sd=a.exponent.sd,
                coefficient=CoefficientPublic(**asdict(a.coefficient)),
                backtest=None if a.backtest is None else score_public(a.backtest),
                predictions=[
                    FeaturePredictedPublic(
                        sparsity=v.sparsity,
                        width=_sliced_width(profile, answer.method, v.sparsity),
                        feature=v.feature,
                        value=None if v.prediction is None else v.prediction.value,
                        band=None if v.prediction is None else list(v.prediction.band),
                        level=answer.level,
                        why_not=v.why_not,
                    )
                    for v in a.values
                ],
            )
            for a in answer.predictors
        ],
    )
