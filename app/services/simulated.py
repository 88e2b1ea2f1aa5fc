"""The simulated curves of one model, method and perplexity protocol, as stored by `simulate` jobs
(`source: simulated`): the newest job's face values with their sampling bands, and its anchored curve.
They are drawn beside measured points, never mixed into them (docs/science.md §2, "Simulated curves")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from app.deps import Services
from app.schemas.predictions import CurvePointPublic
from app.services.series import finite
from core.anchoring import ANCHORED_LAW, SIMULATED_ROLE
from core.tables import SIMULATED_SOURCE, Job, JobStatus, Result

MAX_ROWS = 2_000


@dataclass(frozen=True)
class SimulatedCurves:
    job_id: str
    face: list[CurvePointPublic]  # role "simulated", law null: with the band of a subset of windows
    anchored: list[CurvePointPublic] | None  # law "anchored", when the job ran anchors
    describe: str  # how the simulation was made, for notes


def newest_simulation(
    services: Services,
    model: str,
    method: str,
    dataset: str,
    protocol: tuple[int | None, int | None, str | None],
) -> SimulatedCurves | None:
    """The newest succeeded simulation of `method` on `model` scored under `protocol` (seqlen,
    max_windows, dtype), or None."""
    query = (
        select(Result)
        .join(Job, Job.id == Result.job_id)
        .where(
            Result.model_id == model,
            Result.method == method,
            Result.metric == "ppl",
            Result.dataset == dataset,
            Result.source == SIMULATED_SOURCE,
            Job.status == JobStatus.succeeded,
        )
        .order_by(Result.id.desc())
        .limit(MAX_ROWS)
    )
    with services.store.session() as session:
        rows = [row for row in session.scalars(query) if _protocol(row.protocol) == protocol]
    if not rows:
        return None
    job_id = rows[0].job_id
    assert job_id is not None
    mine = sorted((row for row in rows if row.job_id == job_id), key=lambda row: row.sparsity)
    face = [_point(row) for row in mine if row.law is None and _role(row) == SIMULATED_ROLE]
    anchored = [_point(row) for row in mine if row.law == ANCHORED_LAW]
    simulation = mine[0].protocol.get("simulation") or {}
    describe = (
        f"simulated by job {job_id}: {simulation.get('engine')}"
        + (f", {simulation.get('bases')} bases" if simulation.get("bases") else "")
        + (f" from {simulation.get('basis_windows')} windows" if simulation.get("basis_windows") else "")
        + (f"; anchored at {simulation.get('anchors')}" if anchored else "; no anchor")
    )
    return SimulatedCurves(job_id, face, anchored or None, describe)


def _protocol(protocol: dict[str, Any]) -> tuple[int | None, int | None, str | None]:
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
