"""Stored profiles read back: the newest profile per model and calibration windows, one profile by
model, job and calibration, and a profile as the API shows it (GET /v1/models/{m}/profile).

A profile is a dense pass's spectra, logit-lens readings and mask errors (`core.profiles`); the
profile rung (`app.services.prediction.profile_rung`) and the measured curves' features
(`app.services.prediction.scored_curves`) read it through here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from app.schemas.profiles import (
    LensPublic,
    LinearPublic,
    ProfilePublic,
    SignalPublic,
)
from core.model_sources import ModelSourceError, resolve_model
from core.profiles import (
    CALIBRATION_KEYS,
    METHOD_FEATURES,
    LensMeans,
    LinearErrors,
    SignalSpectrum,
    StoredProfile,
)
from core.settings import Settings
from core.tables import Profile

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
