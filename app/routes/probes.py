"""/v1/jobs/{id}/probes: a probe job's points, filterable, with how well the Taylor estimates track
them; and their plots (`plot.svg`, `plot.png`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Response
from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session

from app.db import Store
from app.deps import SessionDep
from app.pagination import keyset_page
from app.probe_plots import (
    DEFAULT_PROBE,
    GENERATION_PROBES,
    NoProbePoints,
    ProbeView,
    build_figure,
    figure_png,
    figure_svg,
    inline,
)
from app.probes import EstimatedPoint, summarize
from app.problems import Problem, ProblemError
from app.reports import ProbePlot, ProbeSection
from app.schemas import (
    PROBE_KIND_DESCRIPTION,
    PROBE_METRIC_DESCRIPTION,
    PROBE_SPACE_DESCRIPTION,
    ProbeKind,
    ProbePointList,
    ProbePointPublic,
    ProbeSublayer,
)
from app.tables import Job, ProbePoint

router = APIRouter(prefix="/v1/jobs", tags=["probes"])

MAX_INDEX = 2**31 - 1
PLOT_MEDIA = {"svg": "image/svg+xml", "png": "image/png"}
REPORT_VIEWS: tuple[tuple[ProbeView, str], ...] = (
    ("layers", "Per layer: measured deviation and Taylor estimate (local counterfactual, whole block)"),
    ("heatmap", "Greedy generation: embedding 1 - cos by layer and step"),
    ("generation", "Generation divergence per step (greedy and sampled)"),
)

NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": Problem, "description": "No such job"}}
INVALID: dict[int | str, dict[str, Any]] = {422: {"model": Problem, "description": "Invalid query"}}


def point_public(row: ProbePoint) -> ProbePointPublic:
    return ProbePointPublic(
        id=row.id,
        job_id=row.job_id,
        probe=row.probe,
        layer=row.layer,
        sublayer=row.sublayer,
        space=row.space,
        step=row.step,
        metric=row.metric,
        value=row.value,
        estimate=row.estimate,
    )


def _job(session: Session, job_id: str) -> Job:
    job = session.get(Job, job_id)
    if job is None:
        raise ProblemError(404, f"no job with id {job_id!r}", slug="job-not-found")
    return job


@router.get("/{job_id}/probes", response_model=ProbePointList, responses={**NOT_FOUND, **INVALID})
def job_probes(
    job_id: str,
    session: SessionDep,
    probe: Annotated[ProbeKind | None, Query(description=PROBE_KIND_DESCRIPTION)] = None,
    space: Annotated[str | None, Query(max_length=16, description=PROBE_SPACE_DESCRIPTION)] = None,
    metric: Annotated[str | None, Query(max_length=32, description=PROBE_METRIC_DESCRIPTION)] = None,
    sublayer: Annotated[ProbeSublayer | None, Query(description="`attention`, `mlp` or `block`.")] = None,
    layer: Annotated[int | None, Query(ge=0, le=MAX_INDEX, description="Block index from 0.")] = None,
    step: Annotated[int | None, Query(ge=0, le=MAX_INDEX, description="Generation step from 0.")] = None,
    cursor: Annotated[
        int | None, Query(ge=0, le=2**62, description="`next_cursor` of the previous page.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=5000)] = 500,
) -> ProbePointList:
    """The job's probe points in the order it stored them, filtered, a page at a time; `summary`
    compares estimate and value per (probe, sublayer, space, metric) over every matching point
    (all pages): n, Pearson correlation, means and mean relative error."""
    _job(session, job_id)
    filters: dict[Any, Any] = {
        ProbePoint.probe: probe,
        ProbePoint.space: space,
        ProbePoint.metric: metric,
        ProbePoint.sublayer: sublayer,
        ProbePoint.layer: layer,
        ProbePoint.step: step,
    }
    where: list[ColumnElement[bool]] = [ProbePoint.job_id == job_id]
    where += [column == wanted for column, wanted in filters.items() if wanted is not None]
    page, next_cursor = keyset_page(
        session, select(ProbePoint).where(*where), ProbePoint.id, cursor, limit, newest_first=False
    )
    return ProbePointList(
        items=[point_public(row) for row in page],
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
    )
    rows = session.execute(select(*columns).where(*where, ProbePoint.estimate.is_not(None))).all()
    return [
        EstimatedPoint(probe, sublayer, space, metric, value, estimate)
        for probe, sublayer, space, metric, value, estimate in rows
        if estimate is not None
    ]


def _view_points(session: Session, job_id: str, view: str, probe: str | None) -> list[ProbePointPublic]:
    """The points a view can draw (only the probe kinds it reads)."""
    kinds = GENERATION_PROBES if view == "generation" else (probe or DEFAULT_PROBE[view],)
    query = select(ProbePoint).where(ProbePoint.job_id == job_id, ProbePoint.probe.in_(kinds))
    return [point_public(row) for row in session.scalars(query.order_by(ProbePoint.id))]


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
    return f"{job.model_id} - {pruned}"


def _figure(session: Session, job_id: str, view: str, probe: str | None, sublayer: str, metric: str) -> Any:
    job = _job(session, job_id)
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


ViewQuery = Annotated[
    ProbeView,
    Query(
        description="`layers`: per space, measured deviation and Taylor estimate per layer; `heatmap`: "
        "layer x step of embedding-space `metric` of a generation probe; `generation`: per step, KL "
        "and 1 - cos per space and token agreement, greedy and sampled."
    ),
]
ProbeQuery = Annotated[
    ProbeKind | None,
    Query(
        description="Probe drawn: `layers` default `counterfactual`, `heatmap` default `generation-greedy` "
        "(or `generation-sampled`); `generation` draws both generation probes."
    ),
]
SublayerQuery = Annotated[ProbeSublayer, Query(description="Sublayer of the `layers` view.")]
MetricQuery = Annotated[
    str,
    Query(
        min_length=1,
        max_length=32,
        description="Metric of the `layers` panels (KL of probs is always added) and of the `heatmap`.",
    ),
]


def _plot_responses(media: str) -> dict[int | str, dict[str, Any]]:
    return {
        200: {"content": {media: {}}, "description": "The plot"},
        404: {"model": Problem, "description": "No such job, or no probe points for this view"},
        **INVALID,
    }


def _plot_figure(
    job_id: str,
    session: SessionDep,
    view: ViewQuery = "layers",
    probe: ProbeQuery = None,
    sublayer: SublayerQuery = "block",
    metric: MetricQuery = "1-cos",
) -> Any:
    """The figure both plot endpoints render: their path and query parameters, as one dependency."""
    return _figure(session, job_id, view, probe, sublayer, metric)


PlotFigure = Annotated[Any, Depends(_plot_figure)]


@router.get(
    "/{job_id}/probes/plot.svg", response_class=Response, responses=_plot_responses(PLOT_MEDIA["svg"])
)
def probe_plot_svg(figure: PlotFigure) -> Response:
    """A view of the job's probe points as SVG."""
    return Response(figure_svg(figure), media_type=PLOT_MEDIA["svg"])


@router.get(
    "/{job_id}/probes/plot.png", response_class=Response, responses=_plot_responses(PLOT_MEDIA["png"])
)
def probe_plot_png(figure: PlotFigure) -> Response:
    """A view of the job's probe points as PNG."""
    return Response(figure_png(figure), media_type=PLOT_MEDIA["png"])


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
                figures.append((heading, _figure(session, job.id, view, None, "block", "1-cos"), None))
            except ProblemError as missing:
                figures.append((heading, None, missing.detail))
    plots = [
        ProbePlot(
            heading, inline(figure_svg(figure)) if figure is not None else None, (note,) if note else ()
        )
        for heading, figure, note in figures
    ]
    return ProbeSection(summary=summary, plots=plots, points=count)
