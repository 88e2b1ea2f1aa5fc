"""/v1/jobs/{id}/report: a job as an HTML page (summary, results, curves, probes)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from app.deps import ServicesDep
from app.problems import problem_responses
from app.services.reports import job_report_html
from app.views.report import CONTENT_SECURITY_POLICY

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


@router.get(
    "/{job_id}/report",
    response_class=HTMLResponse,
    responses={
        200: {"content": {"text/html": {}}, "description": "The report page"},
        **problem_responses({404: "No such job"}),
    },
)
def job_report(job_id: str, services: ServicesDep) -> HTMLResponse:
    """The job as a page for people: status, timings, stage and error; its results; for each model,
    method and metric of its results the curve (measured points, strict and calibrated laws); its
    probes (how well the Taylor estimates track the measured deviations, and the layer, heatmap and
    generation plots). Plain HTML, no JavaScript."""
    return HTMLResponse(
        job_report_html(services, job_id), headers={"Content-Security-Policy": CONTENT_SECURITY_POLICY}
    )
