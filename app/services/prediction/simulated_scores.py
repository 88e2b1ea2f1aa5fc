"""The task scores a `simulate` job with `accuracy` stored (`source: simulated`): each simulated
sparsity's whole model scored on a task, beside the dense score it compares with. A simulated score
answers an accuracy question only under that dense score's protocol (the same docs, few-shot draw and
dtype), so it is found through the dense result it names rather than by matching protocol keys. A
score scored to a precision rests on a seeded subset of the docs paired with the dense score's
(`paired_docs` in its protocol); its stderr then adds the paired band's to the task's sampling error.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from app.services.prediction.simulated import simulated_rows
from app.services.prediction.store_state import StateCache, StoreState, store_state
from core.prediction.anchoring import SIMULATED_ROLE
from core.tables import Result

CACHE_SIZE = 256
_newest = StateCache(CACHE_SIZE)


@dataclass(frozen=True)
class SimulatedScores:
    """One metric of one task from the newest simulation that compares with a given dense score."""

    job_id: str
    points: tuple[tuple[float, float, float | None], ...]  # (sparsity, value, stderr), by sparsity
    exact: bool  # the simulated model is the pruned model itself (magnitude, stock slicing)
    describe: str


def newest_simulated_scores(
    session: Session,
    model: str,
    method: str,
    task: str,
    metric: str,
    dense_result_id: int,
    state: StoreState | None = None,
) -> SimulatedScores | None:
    """The newest succeeded simulation's `metric` on `task` compared with dense result
    `dense_result_id`, or None; once per state of the store."""
    state = store_state(session) if state is None else state
    key = (state, model, method, task, metric, dense_result_id)
    return _newest.get(key, lambda: _newest_scores(session, model, method, task, metric, dense_result_id))


def _newest_scores(
    session: Session, model: str, method: str, task: str, metric: str, dense_result_id: int
) -> SimulatedScores | None:
    query = simulated_rows(model, method, metric, task)
    rows = [
        row
        for row in session.scalars(query)
        if row.protocol.get("dense_result_id") == dense_result_id
        and (row.protocol.get("simulation") or {}).get("role") == SIMULATED_ROLE
    ]
    if not rows:
        return None
    job_id = str(rows[0].job_id)
    mine = sorted((row for row in rows if str(row.job_id) == job_id), key=lambda row: row.sparsity)
    simulation = mine[0].protocol.get("simulation") or {}
    describe = f"task scores simulated by job {job_id}: {simulation.get('engine')}" + (
        f", {simulation.get('bases')} bases" if simulation.get("bases") else ""
    )
    describe += "; " + _docs_said(mine, metric)
    exact = all((row.protocol.get("simulation") or {}).get("exact") for row in mine)
    points = tuple((row.sparsity, row.value, row.stderr) for row in mine)
    return SimulatedScores(job_id, points, exact, describe)


def _docs_said(rows: list[Result], metric: str) -> str:
    """Which docs each simulated score rests on: every doc, or k of N paired with the dense docs."""
    said = []
    for row in rows:
        paired = (row.protocol.get("paired_docs") or {}).get(metric)
        docs = (
            f"every doc ({row.n})"
            if paired is None or paired["docs"] == paired["of_docs"]
            else (f"{paired['docs']} of {paired['of_docs']} docs paired with the dense score's")
        )
        said.append(f"s={row.sparsity:g} on {docs}")
    return ", ".join(said)
