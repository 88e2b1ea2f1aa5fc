"""/v1/jobs/{id}/report: a job as an HTML page (summary, results, curves, probes)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import HTMLResponse
from sqlalchemy import select

from app.deps import Services, ServicesDep
from app.plots import inline_svg
from app.problems import Problem, ProblemError
from app.reports import CONTENT_SECURITY_POLICY, CurveSection, render_report
from app.routes.jobs import job_public
from app.routes.models import load_curve
from app.routes.probes import probe_section
from app.routes.results import result_public
from app.schemas import ResultPublic
from app.series import ACCURACY_METRICS, DENSE, PPL, Selector
from app.tables import Job, Result

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

MAX_CURVES = 12
"""Curves drawn in one report (each costs a plot): a sweep has one per metric, so this is plenty."""


@router.get(
    "/{job_id}/report",
    response_class=HTMLResponse,
    responses={
        200: {"content": {"text/html": {}}, "description": "The report page"},
        404: {"model": Problem, "description": "No such job"},
    },
)
def job_report(job_id: str, services: ServicesDep) -> HTMLResponse:
    """The job as a page for people: status, timings, stage and error; its results; for each model,
    method and metric of its results the curve (measured points, strict and calibrated laws); its
    probes (how well the Taylor estimates track the measured deviations, and the layer, heatmap and
    generation plots). Plain HTML, no JavaScript."""
    with services.store.sessions() as session:
        job = session.get(Job, job_id)
        if job is None:
            raise ProblemError(404, f"no job with id {job_id!r}", slug="job-not-found")
        rows = session.scalars(select(Result).where(Result.job_id == job_id).order_by(Result.id)).all()
        public = job_public(job)
        results = [result_public(row) for row in rows]
    curves = [_section(services, target) for target in curve_targets(results)[:MAX_CURVES]]
    probes = probe_section(services.store, job)
    return HTMLResponse(
        render_report(public, results, curves, probes),
        headers={"Content-Security-Policy": CONTENT_SECURITY_POLICY},
    )


def curve_targets(results: list[ResultPublic]) -> list[dict[str, Any]]:
    """One curve per (model, method, metric, task, protocol) among the results. Dense-only results
    (an evaluate job) are drawn for the job's pruning method, or SliceGPT when it pruned nothing."""
    methods = sorted({r.method for r in results if r.method != DENSE}) or ["slicegpt"]
    targets: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in results:
        if r.metric != PPL and r.metric not in ACCURACY_METRICS:
            continue
        for method in [r.method] if r.method != DENSE else methods:
            if r.metric == PPL:
                windows = r.protocol.get("max_windows")
                selector = Selector(
                    dataset=r.dataset,
                    seqlen=r.protocol.get("seqlen"),
                    max_windows="all" if windows is None else windows,
                    dtype=r.protocol.get("dtype"),
                )
                task = None
            else:
                selector, task = Selector(), r.dataset
            key = (r.model, method, r.metric, task, selector)
            target = {"model": r.model, "method": method, "metric": r.metric, "task": task}
            targets.setdefault(key, {**target, "selector": selector})
    return list(targets.values())


def _section(services: Services, target: dict[str, Any]) -> CurveSection:
    what = target["metric"] if target["task"] is None else f"{target['metric']} on {target['task']}"
    heading = f"{target['model']} - {target['method']} - {what}"
    try:
        curve = load_curve(
            services, target["model"], target["method"], target["metric"], target["task"], target["selector"]
        )
    except ProblemError as error:
        return CurveSection(heading, None, (f"no curve: {error.detail}",))
    notes = [f"protocol: {curve.protocol.selection}"]
    if curve.calibration is not None:
        notes.append(f"calibrated law: {curve.calibration.formula} ({curve.calibration.reason})")
    notes.extend(curve.notes)
    return CurveSection(heading, inline_svg(curve), tuple(notes))
