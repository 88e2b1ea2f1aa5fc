"""/v1/jobs/{id}/probes: a probe job's points, filterable, with how well the Taylor estimates track
them; and their plots (`plot.svg`, `plot.png`)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Response

from app.deps import CursorQuery, SessionDep
from app.problems import problem_responses
from app.schemas.probes import ProbePointList
from app.services.probes import figure, probe_points
from app.views.probe_plots import ProbeView, figure_png, figure_svg
from core.specs.probe import (
    PROBE_KIND_DESCRIPTION,
    PROBE_METRIC_DESCRIPTION,
    PROBE_SPACE_DESCRIPTION,
    ProbeKind,
    ProbeSublayer,
)
from core.tables import MAX_ROW_ID, ProbePoint

router = APIRouter(prefix="/v1/jobs", tags=["probes"])

PLOT_MEDIA = {"svg": "image/svg+xml", "png": "image/png"}


@router.get(
    "/{job_id}/probes", response_model=ProbePointList, responses=problem_responses({404: "No such job"})
)
def job_probes(
    job_id: str,
    session: SessionDep,
    probe: Annotated[ProbeKind | None, Query(description=PROBE_KIND_DESCRIPTION)] = None,
    space: Annotated[str | None, Query(max_length=16, description=PROBE_SPACE_DESCRIPTION)] = None,
    metric: Annotated[str | None, Query(max_length=32, description=PROBE_METRIC_DESCRIPTION)] = None,
    sublayer: Annotated[ProbeSublayer | None, Query(description="`attention`, `mlp` or `block`.")] = None,
    layer: Annotated[int | None, Query(ge=0, le=MAX_ROW_ID, description="Block index from 0.")] = None,
    step: Annotated[int | None, Query(ge=0, le=MAX_ROW_ID, description="Generation step from 0.")] = None,
    cursor: CursorQuery = None,
    limit: Annotated[int, Query(ge=1, le=5000)] = 500,
) -> ProbePointList:
    """The job's probe points in the order it stored them, filtered, a page at a time; `summary`
    compares estimate and value per (probe, sublayer, space, metric) over every matching point
    (all pages): n, Pearson correlation, means and mean relative error."""
    filters: dict[Any, Any] = {
        ProbePoint.probe: probe,
        ProbePoint.space: space,
        ProbePoint.metric: metric,
        ProbePoint.sublayer: sublayer,
        ProbePoint.layer: layer,
        ProbePoint.step: step,
    }
    return probe_points(session, job_id, filters, cursor, limit)


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
        **problem_responses({404: "No such job, or no probe points for this view"}),
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
    return figure(session, job_id, view, probe, sublayer, metric)


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
