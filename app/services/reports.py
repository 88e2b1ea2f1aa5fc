"""A job's report page (GET /v1/jobs/{id}/report): its results, a curve per model, method, metric and
protocol among them, and its probes, put together for `app.views.report`."""

from __future__ import annotations

from typing import Any

from app.deps import Services
from app.problems import ProblemError
from app.schemas.jobs import JobPublic
from app.schemas.results import ResultPublic
from app.services.jobs import get_job, job_results
from app.services.prediction.curves import load_curve
from app.services.prediction.series import PPL, Selector
from app.services.probes import probe_section
from app.services.profiles import find_profile
from app.services.retention import load_retention
from app.views.curve_plots import inline_svg
from app.views.profile_plots import profile_svg
from app.views.report import CurveSection, render_report
from app.views.retention_plots import retention_svg
from core.methods import DEFAULT_METHOD, DENSE
from core.tasks import ACCURACY_METRICS, TASK_CATALOGUE

MAX_CURVES = 12
"""Curves drawn in one report (each costs a plot): a sweep has one per metric, so this is plenty."""


def job_report_html(services: Services, job_id: str) -> str:
    with services.store.sessions() as session:
        job = get_job(session, job_id)
        rows = job_results(session, job_id)  # a fanned-out sweep's children's points included
        public = JobPublic.model_validate(job)
        results = [ResultPublic.model_validate(row) for row in rows]
    curves = [_section(services, target) for target in curve_targets(results)[:MAX_CURVES]]
    if public.kind == "profile":
        curves.append(_profile_section(services, public))
    if any(r.dataset in TASK_CATALOGUE and r.method != DENSE for r in results):
        curves.append(_retention_section(services, public))
    probes = probe_section(services.store, job)
    return render_report(public, results, curves, probes)


def curve_targets(results: list[ResultPublic]) -> list[dict[str, Any]]:
    """One curve per (model, method, metric, task, protocol) among the results. Dense-only results
    (an evaluate job) are drawn for the job's pruning method, or the default method when it pruned
    nothing."""
    methods = sorted({r.method for r in results if r.method != DENSE}) or [DEFAULT_METHOD]
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


def _profile_section(services: Services, job: JobPublic) -> CurveSection:
    """A profile job's heatmap: what slicing to each width would discard, per signal."""
    heading = f"{job.model} - profile - discarded token energy per signal and width"
    with services.store.sessions() as session:
        profile = find_profile(session, services.settings, job.model, job.id, {})
    if profile is None:
        return CurveSection(heading, None, ("no profile stored (yet) by this job",))
    refused = profile.row.protocol.get("slicing_refusal")
    svg = profile_svg(profile, "wanda" if refused and profile.offers_rule("wanda") else None)
    if refused:
        heading = f"{job.model} - profile - Wanda's mask error per linear (slicing refuses this model)"
    notes = (
        f"calibration: {profile.calibration.get('corpus')} {profile.calibration.get('num_sequences')} x "
        f"{profile.calibration.get('seqlen')}, seed {profile.calibration.get('seed')}; lens tokens "
        f"{profile.row.protocol.get('lens_tokens')}",
        "GET /v1/models/<model>/profile has the numbers; POST /v1/predictions uses them",
    )
    return CurveSection(heading, svg[svg.index("<svg") :], notes)


def _retention_section(services: Services, job: JobPublic) -> CurveSection:
    """When pruning works for this model: every pruning of it the store has scored, this job's among
    them, multiple choice against generative tasks."""
    heading = f"{job.model} - when pruning works: multiple choice vs generation"
    with services.store.sessions() as session:
        view = load_retention(session, job.model)
    if not view.prunings:
        return CurveSection(heading, None, tuple(view.notes))
    svg = retention_svg(view)
    verdicts = [f"{p.method} s={p.sparsity:g}: {p.verdict}" for p in view.prunings]
    notes = (*verdicts, "GET /v1/models/<model>/retention has the numbers, per task and the probes' readings")
    return CurveSection(heading, svg[svg.index("<svg") :], notes)


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
