"""The store's measured curves with their profile features, and the backtests over them: what every
rung's record and the profile rung's coefficients are learned from.

A curve is a stored perplexity fit (a `sweep`'s points and dense baseline); its features come from
the newest profile of the same model under the same calibration windows (`CALIBRATION_KEYS`), the
ones its method is predicted from (`METHOD_FEATURES`: slicing's spectra and lens readings, or a mask
rule's output errors). A fit without such a profile still scores the calibrated laws (and slicing's
strict law), not the feature laws. The curves and their backtests are computed once per state of the
store (`scored_curves`), not on every prediction.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.services.prediction.store_state import StateCache, StoreState, store_state
from app.services.profiles import CalibrationKey, calibration_key, newest_profiles
from core.prediction.backtests import (
    Curve,
    Score,
    backtest,
)
from core.profiles import (
    METHOD_FEATURES,
    StoredProfile,
    sibling_methods,
)
from core.published import PUBLISHED
from core.tables import Fit


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
    the store (`app.services.prediction.store_state`)."""
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
