"""A job's report as one HTML page: summary, results, curves and probes (inline SVG).

Plain HTML with inline CSS, no script: it opens in any browser, prints, and can be saved as one
file. Every value from the store or the request is escaped; the SVGs come from matplotlib, whose
XML writer escapes their text. The route serves it with a Content-Security-Policy that allows no
script at all, as a second line of defence.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from html import escape
from typing import Any

from app.schemas.jobs import JobPublic
from app.schemas.probes import ProbeSummary
from app.schemas.results import ResultPublic
from core.probe_conventions import DEFAULT_CONVENTION

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'none'"
)

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1b1b1b;
       margin: 0 auto; max-width: 1100px; padding: 24px; background: #fafafa; }
h1 { font-size: 22px; margin: 0 0 4px; word-break: break-all; }
h2 { font-size: 17px; margin: 28px 0 8px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
h3 { font-size: 14px; margin: 18px 0 6px; word-break: break-all; }
.sub { color: #555; margin: 0 0 16px; }
table { border-collapse: collapse; width: 100%; background: #fff; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
dl.summary { display: grid; grid-template-columns: max-content 1fr; gap: 4px 16px; margin: 0; }
dl.summary dt { color: #555; } dl.summary dd { margin: 0; word-break: break-all; }
.status { display: inline-block; padding: 1px 8px; border-radius: 10px; font-weight: 600; }
.status-succeeded { background: #dff3e3; color: #14612a; }
.status-failed, .status-canceled { background: #fbe3e1; color: #8a1c13; }
.status-queued, .status-running { background: #e3ecfb; color: #173f87; }
.error { background: #fbe3e1; border: 1px solid #e7b5b0; padding: 8px; white-space: pre-wrap; }
.curve { background: #fff; border: 1px solid #ddd; padding: 8px; margin-bottom: 16px; }
.curve svg { max-width: 100%; height: auto; }
.note { color: #555; font-size: 13px; }
pre { background: #fff; border: 1px solid #ddd; padding: 8px; overflow-x: auto; font-size: 12px; }
"""


RESULT_COLUMNS = (
    "id",
    "model",
    "method",
    "sparsity",
    "metric",
    "dataset",
    "value",
    "stderr",
    "n",
    "source",
    "protocol",
)


@dataclass(frozen=True)
class CurveSection:
    """One curve of the report: its heading, and the inline SVG or why there is none."""

    heading: str
    svg: str | None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProbePlot:
    """One probe plot of the report: its heading, and the inline SVG or why there is none."""

    heading: str
    svg: str | None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProbeSection:
    """The job's probe points: how well the estimates track them, and the plots."""

    summary: list[ProbeSummary]
    plots: list[ProbePlot]
    points: int


PROBE_COLUMNS = (
    "probe",
    "sublayer",
    "space",
    "metric",
    "n",
    "Pearson r (estimate vs value)",
    "mean value",
    "mean estimate",
    "mean rel. error",
)


def _e(value: Any) -> str:
    return escape("" if value is None else str(value), quote=True)


def _time(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S UTC") if value else "-"


def _seconds(start: datetime | None, end: datetime | None) -> str:
    if start is None or end is None:
        return "-"
    return f"{(end - start).total_seconds():.1f} s"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _protocol_summary(protocol: dict[str, Any]) -> str:
    keys = ("seqlen", "max_windows", "windows", "dtype", "chance", "n_options")
    parts = [f"{key}={protocol[key]}" for key in keys if key in protocol]
    return ", ".join(parts)


def _summary(job: JobPublic) -> str:
    rows = [
        ("id", _e(job.id)),
        ("kind", _e(job.kind)),
        ("status", f'<span class="status status-{_e(job.status)}">{_e(job.status)}</span>'),
        ("model", _e(job.model)),
        ("stage", _e(job.stage) + (f" ({_e(job.detail)})" if job.detail else "")),
        ("progress", f"{job.progress:.0%}"),
        ("attempts", _e(job.attempts)),
        ("worker", _e(job.worker or "-")),
        ("created", _e(_time(job.created_at))),
        ("started", _e(_time(job.started_at))),
        ("finished", _e(_time(job.finished_at))),
        ("waited in queue", _e(_seconds(job.created_at, job.started_at))),
        ("ran for", _e(_seconds(job.started_at, job.finished_at))),
    ]
    items = "".join(f"<dt>{name}</dt><dd>{value}</dd>" for name, value in rows)
    error = f'<p class="error">{_e(job.error)}</p>' if job.error else ""
    request = _e(json.dumps(job.request, indent=2, sort_keys=True))
    return (
        f'<section id="summary"><h2>Job</h2><dl class="summary">{items}</dl>{error}'
        f"<h3>Request</h3><pre>{request}</pre></section>"
    )


def _results(results: list[ResultPublic]) -> str:
    if not results:
        return '<section id="results"><h2>Results</h2><p class="note">No results stored.</p></section>'
    head = "".join(f"<th>{name}</th>" for name in RESULT_COLUMNS)
    rows = "".join(
        "<tr>"
        f'<td class="num">{r.id}</td><td>{_e(r.model)}</td><td>{_e(r.method)}</td>'
        f'<td class="num">{r.sparsity:g}</td><td>{_e(r.metric)}</td><td>{_e(r.dataset)}</td>'
        f'<td class="num">{_e(_number(r.value))}</td><td class="num">{_e(_number(r.stderr))}</td>'
        f'<td class="num">{_e(r.n if r.n is not None else "-")}</td><td>{_e(r.source)}</td>'
        f"<td>{_e(_protocol_summary(r.protocol))}</td>"
        "</tr>"
        for r in results
    )
    return f'<section id="results"><h2>Results</h2><table><tr>{head}</tr>{rows}</table></section>'


def _curves(curves: list[CurveSection]) -> str:
    if not curves:
        body = '<p class="note">No curve: the job stored no perplexity or accuracy result.</p>'
    else:
        body = "".join(
            f'<div class="curve"><h3>{_e(c.heading)}</h3>'
            + (c.svg or "")
            + "".join(f'<p class="note">{_e(note)}</p>' for note in c.notes)
            + "</div>"
            for c in curves
        )
    return f'<section id="curves"><h2>Curves</h2>{body}</section>'


def _probe_label(probe: str, decoding_steps: bool, convention: str) -> str:
    """A summary row's probe, with where it was read and, off the default, by which convention."""
    label = probe + (" (decoding steps)" if decoding_steps else "")
    return label if convention == DEFAULT_CONVENTION else f"{label} [{convention}]"


def _probes(section: ProbeSection | None) -> str:
    if section is None or not section.points:
        body = (
            '<p class="note">No probes stored for this job. A `probe` job measures where pruning bends '
            "the model, layer by layer and step by step (docs/science.md §3).</p>"
        )
        return f'<section id="probes"><h2>Probes</h2>{body}</section>'
    intro = (
        f'<p class="note">{section.points} probe points; all of them at '
        f"<code>GET /v1/jobs/&lt;id&gt;/probes</code>.</p>"
    )
    if section.summary:
        head = "".join(f"<th>{_e(name)}</th>" for name in PROBE_COLUMNS)
        rows = "".join(
            "<tr>"
            f"<td>{_e(_probe_label(s.probe, s.decoding_steps, s.convention))}</td>"
            f"<td>{_e(s.sublayer or '-')}</td><td>{_e(s.space)}</td>"
            f'<td>{_e(s.metric)}</td><td class="num">{s.n}</td>'
            f'<td class="num">{_e(_number(s.correlation))}</td>'
            f'<td class="num">{_e(_number(s.mean_value))}</td>'
            f'<td class="num">{_e(_number(s.mean_estimate))}</td>'
            f'<td class="num">{_e(_number(s.mean_relative_error))}</td>'
            "</tr>"
            for s in section.summary
        )
        table = (
            "<h3>Taylor estimates against measured values</h3>"
            f'<table id="probe-summary"><tr>{head}</tr>{rows}</table>'
        )
    else:
        table = '<p class="note">No point has a Taylor estimate.</p>'
    plots = "".join(
        f'<div class="curve"><h3>{_e(p.heading)}</h3>'
        + (p.svg or "")
        + "".join(f'<p class="note">{_e(note)}</p>' for note in p.notes)
        + "</div>"
        for p in section.plots
    )
    return f'<section id="probes"><h2>Probes</h2>{intro}{table}{plots}</section>'


def render_report(
    job: JobPublic,
    results: list[ResultPublic],
    curves: list[CurveSection],
    probes: ProbeSection | None = None,
) -> str:
    """The whole page."""
    title = f"prunecast report: {job.kind} {job.model}"
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body>"
        f"<h1>{_e(job.kind)} job on {_e(job.model)}</h1>"
        f'<p class="sub">job {_e(job.id)} - <span class="status status-{_e(job.status)}">'
        f"{_e(job.status)}</span></p>"
        f"{_summary(job)}{_results(results)}{_curves(curves)}{_probes(probes)}"
        "</body></html>\n"
    )
