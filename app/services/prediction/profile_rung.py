"""The profile rung: what a model's dense profile predicts before it is pruned, through a feature law
chosen on other models' records (`_chosen_nested`; the method's pre-registered law,
`core.prediction.registry`, until they exist), its coefficient learned from the store's other curves
and the model's own points, judged on the nested record of that choice in the mode that matches what
is known of the model (docs/science.md, "Predicting before pruning"). The other feature laws stay
visible beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy.orm import Session

from app.schemas.profiles import (
    BeforePruningPublic,
    CoefficientPublic,
    FeaturePredictedPublic,
    PredictorPublic,
)
from app.schemas.records import verdict_public
from app.services.prediction.records import score_public
from app.services.prediction.scored_curves import _features_at, matches_profile, scored_curves
from app.services.prediction.store_state import StateCache, StoreState
from app.services.profiles import calibration_key, newest_profiles
from core.prediction import feature_laws, records
from core.prediction.backtests import (
    CROSS_METHOD,
    ONE_POINT,
    ZERO_CURVE,
    ZERO_MODEL,
    Curve,
    FeatureLaw,
    HeldOut,
    LawFit,
    Score,
    cross_method_prior,
    feature_predictor,
    law_coefficient,
    law_prior,
)
from core.prediction.records import Verdict, verdict
from core.prediction.registry import PROFILE_PREDICTORS
from core.profiles import (
    METHOD_FEATURES,
    StoredProfile,
)


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
    calibration, else `points` (the caller's, or the prune jobs' of the asked protocol). The law chosen
    on other models' records in the mode that matches what is known (`_known_mode`, `_chosen_nested`)
    answers, else the method's pre-registered one; the others stay visible beside it."""
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
    mode_chosen = mode in CHOSEN_MODES and _both_possible(model, others, scored.siblings)
    nested = None if mode_chosen else _chosen_nested(answers, scores, mode, model, level)
    chosen, reason, record = nested or _registered(answers, scores, mode, method, profile)
    if not answers:
        reason = (
            f"no measured {method} curve of a profiled model in the store to learn the laws' coefficients "
            f"from: sweep {method} on a model and profile it under the sweep's calibration"
        )
    own_points = 0 if own_curve is None else len(own_curve.points)
    if chosen is not None and mode_chosen:
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
"""The modes of a model with no curve of the method: judged only on records over other models."""


def _both_possible(model: str, others: Sequence[Curve], siblings: Sequence[Curve]) -> bool:
    """Whether carrying over and pooling could both answer for a model with no curve of the method."""
    return any(c.model != model for c in others) and any(c.model == model for c in siblings)


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


PREDICTOR_NESTED_MODE = "feature law chosen on other models, scored nested"


def _chosen_nested(
    answers: list[PredictorAnswer],
    scores: dict[tuple[str, str], Score],
    mode: str,
    model: str,
    level: float,
) -> tuple[str, str, Score] | None:
    """The feature law with the lowest pooled |ln| miss in `mode` over *other* models' curves, why,
    and the record of that choice made nested (each model's points judged under the law chosen
    without them, `records.nested`); None until other models' records hold `records.MIN_POINTS`
    points, when the registered predictor answers. bench/profile_records.py measured this choice
    against the registry on both models: x1.08-x1.5 against x1.42-x9.19 at zero points. Left to the
    registry where the mode itself was chosen between carrying over and pooling (that choice is
    nested on the registered predictor's records)."""
    answering = {answer.predictor for answer in answers}
    candidates = {
        name: score.points
        for (name, in_mode), score in scores.items()
        if in_mode == mode and name in answering
    }
    name = records.choose(candidates, exclude_model=model)
    if name is None:
        return None
    others = len({point.model for point in candidates[name] if point.model != model})
    reason = (
        f"the feature law with the lowest |ln| miss in mode `{mode}` over {others} other model(s)' "
        f"curves, chosen without this model's points; its record is that choice made nested"
    )
    return name, reason, Score(name, PREDICTOR_NESTED_MODE, level, tuple(records.nested(candidates)))


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
