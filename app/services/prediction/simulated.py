"""The simulated curves of one model, method and perplexity protocol, as stored by `simulate` jobs
(`source: simulated`): the newest job's face values with their sampling bands, and its anchored curve;
and the simulated rung's record, every stored simulation scored against the measured points of the
same model, method, protocol and calibration. They are drawn beside measured points, never mixed into
them (docs/science.md §2, "Simulated curves").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from app.schemas.predictions import CurvePointPublic
from app.services.prediction.series import finite
from app.services.prediction.store_state import StateCache, StoreState, store_state
from app.services.profiles import calibration_key
from core.prediction.anchoring import ANCHORED_LAW, SIMULATED_ROLE
from core.prediction.backtests import HeldOut, Score
from core.tables import SIMULATED_SOURCE, Job, JobStatus, Result

MAX_ROWS = 2_000
MAX_RECORD_ROWS = 20_000

ProtocolKey = tuple[int | None, int | str | None, str | None]
"""(seqlen, max_windows, dtype) of a perplexity protocol."""
CACHE_SIZE = 256
_newest = StateCache(CACHE_SIZE)

FACE = "simulated at face value"
ANCHORED = "simulated, anchored"
SIMULATION_MODE = "zero-points, simulated"
"""The mode of a simulation's record: it reads no measured point of the curve it predicts (its
anchors, the method itself, are left out of the anchored record)."""


@dataclass(frozen=True)
class SimulatedCurves:
    job_id: str
    face: list[CurvePointPublic]  # role "simulated", law null: with the band of a subset of windows
    anchored: list[CurvePointPublic] | None  # law "anchored", when the job ran anchors
    describe: str  # how the simulation was made, for notes
    exact: bool = False  # the face values are the pruned model itself (magnitude, stock slicing)
    anchors: tuple[float, ...] = ()


def newest_simulation(
    session: Session,
    model: str,
    method: str,
    dataset: str,
    protocol: ProtocolKey,
    *,
    any_unset: bool = False,
    state: StoreState | None = None,
) -> SimulatedCurves | None:
    """The newest succeeded simulation of `method` on `model` scored under `protocol` (seqlen,
    max_windows, dtype; with `any_unset`, a None field matches any value and max_windows "all" the
    whole split), or None; once per state of the store."""
    state = store_state(session) if state is None else state
    key = (state, model, method, dataset, protocol, any_unset)
    return _newest.get(key, lambda: _newest_simulation(session, model, method, dataset, protocol, any_unset))


def simulated_rows(model: str, method: str, metric: str, dataset: str) -> Select[Result]:
    """The newest `MAX_ROWS` simulated rows of succeeded jobs of one model, method, metric and dataset
    (a task's name for task scores), newest first."""
    return (
        select(Result)
        .join(Job, Job.id == Result.job_id)
        .where(
            Result.model_id == model,
            Result.method == method,
            Result.metric == metric,
            Result.dataset == dataset,
            Result.source == SIMULATED_SOURCE,
            Job.status == JobStatus.succeeded,
        )
        .order_by(Result.id.desc())
        .limit(MAX_ROWS)
    )


def _matches(found: ProtocolKey, wanted: ProtocolKey, any_unset: bool) -> bool:
    if not any_unset:
        return found == wanted
    seqlen, windows, dtype = wanted
    return (
        (seqlen is None or found[0] == seqlen)
        and (windows is None or found[1] == (None if windows == "all" else windows))
        and (dtype is None or found[2] == dtype)
    )


def _newest_simulation(
    session: Session, model: str, method: str, dataset: str, protocol: ProtocolKey, any_unset: bool
) -> SimulatedCurves | None:
    query = simulated_rows(model, method, "ppl", dataset)
    rows = [row for row in session.scalars(query) if _matches(_protocol(row.protocol), protocol, any_unset)]
    if not rows:
        return None
    job_id = rows[0].job_id
    assert job_id is not None
    mine = sorted((row for row in rows if row.job_id == job_id), key=lambda row: row.sparsity)
    face_rows = [row for row in mine if row.law is None and _role(row) == SIMULATED_ROLE]
    face = [_point(row) for row in face_rows]
    anchored = [_point(row) for row in mine if row.law == ANCHORED_LAW]
    simulation = (face_rows or mine)[0].protocol.get("simulation") or {}
    describe = (
        f"simulated by job {job_id}: {simulation.get('engine')}"
        + (f", {simulation.get('bases')} bases" if simulation.get("bases") else "")
        + (f" from {simulation.get('basis_windows')} windows" if simulation.get("basis_windows") else "")
        + (f" streamed in {simulation.get('basis_dtype')}" if simulation.get("basis_dtype") else "")
        + _window_dtype_said(simulation, (face_rows or mine)[0].protocol.get("dtype"))
        + (f"; anchored at {simulation.get('anchors')}" if anchored else "; no anchor")
        + _windows_said(face_rows)
    )
    exact = bool(face_rows) and all((r.protocol.get("simulation") or {}).get("exact") for r in face_rows)
    anchors = tuple(float(a) for a in simulation.get("anchors") or ())
    return SimulatedCurves(job_id, face, anchored or None, describe, exact, anchors)


def _window_dtype_said(simulation: dict[str, Any], dtype: str | None) -> str:
    """Where further windows ran in another dtype than the model's, and how they were corrected."""
    cheap = simulation.get("window_dtype")
    if not cheap or cheap == dtype:
        return ""
    which = "the pilot and further windows" if simulation.get("pilot_on_copy") else "windows past the pilot"
    return f"; {which} scored in {cheap}, each corrected by the dense model's {cheap} gap"


def _windows_said(rows: list[Result]) -> str:
    """Which windows the face values rest on: a few of them paired with the dense model's, or all."""
    samplings = [row.protocol.get("sampling") for row in rows]
    used = [s for s in samplings if s]
    if not used:
        windows = {row.protocol.get("windows") for row in rows}
        return f"; every point on {', '.join(str(w) for w in sorted(windows, key=str))} windows"
    counts = sorted(int(s["windows"]) for s in used)
    spread = str(counts[0]) if counts[0] == counts[-1] else f"{counts[0]}-{counts[-1]}"
    partners = sorted(
        {str(s.get("paired_with") or "dense") for s in used if int(s["windows"]) < int(s["of_windows"])}
    )
    with_whom = " and ".join("the dense model's" if p == "dense" else p + "'s" for p in partners) or "none"
    return (
        f"; each point on {spread} of {used[0]['of_windows']} windows (seeded order {used[0]['order_seed']}) "
        f"paired with {with_whom} ({used[0]['estimator']} estimator), banded for the full-window "
        f"value to ±{100 * float(used[0]['precision'] or 0):g} %"
    )


def _protocol(protocol: dict[str, Any]) -> ProtocolKey:
    return protocol.get("seqlen"), protocol.get("max_windows"), protocol.get("dtype")


def _role(row: Result) -> str | None:
    return (row.protocol.get("simulation") or {}).get("role")


def _point(row: Result) -> CurvePointPublic:
    band = row.protocol.get("band") or {}
    return CurvePointPublic(
        sparsity=row.sparsity,
        value=finite(row.value),
        low=finite(band.get("low")),
        high=finite(band.get("high")),
    )


# ------------------------------------------------------------------------------------------- record


RECORD_CACHE_SIZE = 32
_records = StateCache(RECORD_CACHE_SIZE)


def simulation_records(
    session: Session, method: str, level: float, state: StoreState | None = None
) -> dict[str, Score]:
    """The simulated rung's record for `method` (`FACE` and `ANCHORED`), computed once per state of
    the store: every model, protocol and calibration with both a succeeded simulation (its newest)
    and measured pruned points, each measured point at a simulated sparsity a held-out point."""
    state = store_state(session) if state is None else state
    return _records.get((state, method, level), lambda: _score_simulations(session, method, level))


def _curve_key(row: Result) -> tuple[Any, ...]:
    return (
        row.model_id,
        row.dataset,
        _protocol(row.protocol),
        calibration_key(row.protocol.get("calibration")),
    )


def _score_simulations(session: Session, method: str, level: float) -> dict[str, Score]:
    measured, simulated = _read_curves(session, method)
    held: dict[str, list[HeldOut]] = {FACE: [], ANCHORED: []}
    for curve, rows in simulated.items():
        truth = measured.get(curve)
        if truth:
            for predictor, point in _held_out(curve, rows, truth, method):
                held[predictor].append(point)
    return {name: Score(name, SIMULATION_MODE, level, tuple(points)) for name, points in held.items()}


def _read_curves(
    session: Session, method: str
) -> tuple[dict[tuple[Any, ...], dict[float, float]], dict[tuple[Any, ...], list[Result]]]:
    """Per curve (model, dataset, protocol, calibration): the newest measured value at each pruned
    sparsity, and the rows of the newest simulation."""
    query = (
        select(Result)
        .outerjoin(Job, Job.id == Result.job_id)
        .where(
            Result.method == method,
            Result.metric == "ppl",
            Result.sparsity > 0.0,
            Result.source.in_(("measured", SIMULATED_SOURCE)),
            (Result.source != SIMULATED_SOURCE) | (Job.status == JobStatus.succeeded),
        )
        .order_by(Result.id.desc())
        .limit(MAX_RECORD_ROWS)
    )
    measured: dict[tuple[Any, ...], dict[float, float]] = {}
    newest_job: dict[tuple[Any, ...], str] = {}
    simulated: dict[tuple[Any, ...], list[Result]] = {}
    for row in session.scalars(query):
        curve = _curve_key(row)
        if row.source != SIMULATED_SOURCE:
            measured.setdefault(curve, {}).setdefault(round(row.sparsity, 6), row.value)
            continue
        job = newest_job.setdefault(curve, str(row.job_id))
        if str(row.job_id) == job:
            simulated.setdefault(curve, []).append(row)
    return measured, simulated


def _held_out(
    curve: tuple[Any, ...], rows: list[Result], truth: dict[float, float], method: str
) -> list[tuple[str, HeldOut]]:
    """A simulation's rows at measured sparsities as held-out points: face values all, anchored
    values except at the anchors themselves (there the method was run)."""
    label = _label(curve, method)
    simulation = rows[0].protocol.get("simulation") or {}
    anchors = {round(float(a), 6) for a in simulation.get("anchors") or ()}
    held = []
    for row in rows:
        at = round(row.sparsity, 6)
        if at not in truth:
            continue
        if row.law is None and _role(row) == SIMULATED_ROLE:
            predictor, fitted_on = FACE, f"nothing measured (job {row.job_id})"
        elif row.law == ANCHORED_LAW and at not in anchors:
            predictor, fitted_on = ANCHORED, f"the anchors of job {row.job_id}"
        else:
            continue
        band = row.protocol.get("band") or {}
        low, high = band.get("low"), band.get("high")
        stated = None if low is None or high is None else (float(low), float(high))
        point = HeldOut(row.model_id, label, row.sparsity, truth[at], row.value, stated, fitted_on)
        held.append((predictor, point))
    return held


def _label(curve: tuple[Any, ...], method: str) -> str:
    model, dataset, (seqlen, windows, dtype), calibration = curve
    protocol = f"{dataset} seqlen {seqlen} windows {windows or 'all'} {dtype}"
    return f"{model} / {method} / calibration {calibration} / {protocol}"
