"""A probe job's points as the API reads them: filtered pages, the estimate-vs-value summary, the
figures of each view, and the report's probe section."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session

from app.pagination import keyset_page
from app.problems import ProblemError
from app.schemas.probes import ProbePointList, ProbePointPublic
from app.services.jobs import get_job
from app.services.probe_summary import EstimatedPoint, summarize
from app.views.probe_plots import (
    DEFAULT_PROBE,
    GENERATION_PROBES,
    NoProbePoints,
    ProbeView,
    build_figure,
    figure_svg,
    inline,
)
from app.views.report import ProbePlot, ProbeSection
from core.probe_conventions import DEFAULT_CONVENTION
from core.store import Store
from core.tables import Job, ProbePoint

COUNTERFACTUAL = "counterfactual"
REPORT_VIEWS: tuple[tuple[ProbeView, str], ...] = (
    ("layers", "Per layer: measured deviation and Taylor estimate (local counterfactual, whole block)"),
    ("heatmap", "Greedy generation: embedding 1 - cos by layer and step"),
    ("generation", "Generation divergence per step (greedy and sampled)"),
)


def probe_points(
    session: Session, job_id: str, filters: dict[Any, Any], cursor: int | None, limit: int
) -> ProbePointList:
    """One page of the job's points matching `filters` (column -> wanted value, None: any), in the
    order the job stored them, and the summary over every matching point (all pages)."""
    get_job(session, job_id)
    where: list[ColumnElement[bool]] = [ProbePoint.job_id == job_id]
    where += [column == wanted for column, wanted in filters.items() if wanted is not None]
    page, next_cursor = keyset_page(
        session, select(ProbePoint).where(*where), ProbePoint.id, cursor, limit, newest_first=False
    )
    return ProbePointList(
        items=[ProbePointPublic.model_validate(row) for row in page],
        next_cursor=next_cursor,
        summary=summarize(_estimated(session, where)),
    )


def _estimated(session: Session, where: Sequence[ColumnElement[bool]]) -> list[EstimatedPoint]:
    columns = (
        ProbePoint.probe,
        ProbePoint.sublayer,
        ProbePoint.space,
        ProbePoint.metric,
        ProbePoint.value,
        ProbePoint.estimate,
        ProbePoint.step,
        ProbePoint.convention,
    )
    rows = session.execute(select(*columns).where(*where, ProbePoint.estimate.is_not(None))).all()
    return [
        EstimatedPoint(
            probe,
            sublayer,
            space,
            metric,
            value,
            estimate,
            probe == COUNTERFACTUAL and step is not None,
            convention,
        )
        for probe, sublayer, space, metric, value, estimate, step, convention in rows
        if estimate is not None
    ]


def _view_points(session: Session, job_id: str, view: str, probe: str | None) -> list[ProbePointPublic]:
    """The points a view can draw (only the probe kinds it reads)."""
    kinds = GENERATION_PROBES if view == "generation" else (probe or DEFAULT_PROBE[view],)
    query = select(ProbePoint).where(ProbePoint.job_id == job_id, ProbePoint.probe.in_(kinds))
    return [ProbePointPublic.model_validate(row) for row in session.scalars(query.order_by(ProbePoint.id))]


def probe_title(job: Job) -> str:
    """The model and what pruned it, from the probe job's request."""
    request = job.request or {}
    if request.get("artifact_job_id"):
        pruned = f"artifact of job {request['artifact_job_id']}"
    elif request.get("method"):
        pattern = request.get("pattern") or "unstructured"
        pruned = f"{request['method']} at sparsity {request.get('sparsity')}"
        pruned += f" ({pattern})" if pattern != "unstructured" else ""
    else:
        pruned = f"{job.kind} job {job.id}"
    convention = request.get("convention") or DEFAULT_CONVENTION
    temperature = request.get("temperature")
    reading = f"{convention} convention" + (
        f", T={temperature:g}" if isinstance(temperature, int | float) else ""
    )
    return f"{job.model_id} - {pruned} ({reading})"


def figure(session: Session, job_id: str, view: str, probe: str | None, sublayer: str, metric: str) -> Any:
    job = get_job(session, job_id)
    points = _view_points(session, job_id, view, probe)
    try:
        return build_figure(
            view, points, probe=probe, sublayer=sublayer, metric=metric, title=probe_title(job)
        )
    except NoProbePoints as missing:
        raise ProblemError(
            404,
            f"job {job_id} has no probe points for view {view!r}: {missing}",
            slug="probe-points-not-found",
            title="No probe points",
        ) from missing


def probe_section(store: Store, job: Job) -> ProbeSection:
    """The report's probe section: the summary and the three default views of a job's points."""
    with store.sessions() as session:
        count = session.scalar(select(func.count()).where(ProbePoint.job_id == job.id)) or 0
        if not count:
            return ProbeSection(summary=[], plots=[], points=0)
        summary = summarize(_estimated(session, [ProbePoint.job_id == job.id]))
        figures: list[tuple[str, Any, str | None]] = []
        for view, heading in REPORT_VIEWS:
            try:
                figures.append((heading, figure(session, job.id, view, None, "block", "1-cos"), None))
            except ProblemError as missing:
                figures.append((heading, None, missing.detail))
    plots = [
        ProbePlot(
            heading, inline(figure_svg(figure)) if figure is not None else None, (note,) if note else ()
        )
        for heading, figure, note in figures
    ]
    return ProbeSection(summary=summary, plots=plots, points=count)
