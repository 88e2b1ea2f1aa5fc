"""Curves as SVG and PNG: measured points, the strict law (dashed) and the calibrated law with its band.

matplotlib is imported on the first plot, not with the app, so the API starts fast; it renders
with the Agg canvas (no display) through the object-oriented API only (no pyplot state), so
concurrent requests in the threadpool do not share a figure. Text is never parsed as mathtext
(a model name with `$` is just text) and SVG text stays text, escaped by matplotlib's XML writer.
"""

from __future__ import annotations

import io
import math
import textwrap
from typing import TYPE_CHECKING, Any

from app.schemas.predictions import CurvePublic

if TYPE_CHECKING:
    from matplotlib.figure import Figure

WIDTH_IN, HEIGHT_IN = 7.0, 4.6
PNG_DPI = 110
MEASURED_COLOR = "#111111"
STRICT_COLOR = "#c0392b"
CALIBRATED_COLOR = "#1f5fa8"
PROFILE_COLOR = "#2e8b57"
SIMULATED_COLOR = "#d35400"
ANCHORED_COLOR = "#7d3c98"
ANSWER_COLOR = "#0b7a75"

_configured = False


def load_matplotlib() -> Any:
    """Import matplotlib on first use, configured for a headless server."""
    global _configured
    import matplotlib

    if not _configured:
        matplotlib.use("Agg", force=True)
        matplotlib.rcParams["svg.fonttype"] = "none"  # text as <text>: small, selectable, escaped
        matplotlib.rcParams["svg.hashsalt"] = "prunecast"  # stable ids: same curve, same SVG
        _configured = True
    return matplotlib


def title_of(curve: CurvePublic) -> str:
    protocol = curve.protocol
    what = curve.metric if curve.task is None else f"{curve.metric} on {curve.task}"
    if curve.metric == "ppl":
        windows = "all" if protocol.max_windows is None else protocol.max_windows
        parts = [protocol.dataset, f"seqlen {protocol.seqlen}" if protocol.seqlen else None]
        parts += [f"max_windows {windows}", protocol.dtype]
        detail = ", ".join(part for part in parts if part)
    else:
        detail = f"chance {protocol.chance:.3g}" if protocol.chance is not None else "chance unknown"
    published = " - published" if curve.source == "published" else ""
    return f"{curve.model} - {curve.method} - {what} ({detail}){published}"


def _values(points: list[Any] | None, attr: str) -> list[float]:
    return [v for p in points or [] if (v := getattr(p, attr)) is not None and math.isfinite(v)]


def _limits(curve: CurvePublic) -> tuple[float, float]:
    measured = [p.value for p in curve.measured]
    if curve.metric != "ppl":
        floor = curve.protocol.chance if curve.protocol.chance is not None else min(measured)
        low = min([floor, *measured, *_values(curve.calibrated, "low")])
        return max(0.0, low - 0.05), min(1.0, max(measured) + 0.05)
    top_cap = 20.0 * max(measured)
    shown = [*measured, *_values(curve.calibrated, "value"), *_values(curve.calibrated, "high")]
    shown += [*_values(curve.simulated, "value"), *_values(curve.anchored, "value")]
    if curve.calibrated is None:
        shown += [v for v in _values(curve.strict, "value") if v <= 3.0 * max(measured)]
    bottom = min([*measured, *_values(curve.calibrated, "value")])
    return bottom / 1.15, min(max(shown) * 1.3, top_cap)


def figure(curve: CurvePublic) -> Figure:
    """The curve drawn on a new Agg figure."""
    load_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(WIDTH_IN, HEIGHT_IN), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    low, high = _limits(curve)
    if curve.metric == "ppl":
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    if curve.calibrated:
        xs = [p.sparsity for p in curve.calibrated]
        # no band where the law is not drawn (short of an affine law's first fitted point)
        lo = [math.nan if p.value is None else low if p.low is None else p.low for p in curve.calibrated]
        hi = [math.nan if p.value is None else high if p.high is None else p.high for p in curve.calibrated]
        ax.fill_between(
            xs, lo, hi, color=CALIBRATED_COLOR, alpha=0.18, linewidth=0, label=f"{curve.level:.0%} band"
        )
        ys = [p.value if p.value is not None else math.nan for p in curve.calibrated]
        law = curve.calibration.law if curve.calibration else "calibrated"
        ax.plot(xs, ys, color=CALIBRATED_COLOR, linewidth=2, label=f"calibrated law ({law})")
    if curve.profile_predicted:
        xs = [p.sparsity for p in curve.profile_predicted]
        lo = [p.low if p.low is not None else low for p in curve.profile_predicted]
        hi = [p.high if p.high is not None else high for p in curve.profile_predicted]
        ax.fill_between(xs, lo, hi, color=PROFILE_COLOR, alpha=0.15, linewidth=0)
        ys = [p.value if p.value is not None else math.nan for p in curve.profile_predicted]
        label = f"from the profile ({curve.profile_predictor})"
        ax.plot(xs, ys, color=PROFILE_COLOR, linewidth=1.8, linestyle="-.", label=label)
    _simulated(ax, curve, low, high)
    _answer(ax, curve, low, high)
    if curve.strict:
        xs = [p.sparsity for p in curve.strict]
        ys = [p.value if p.value is not None else math.nan for p in curve.strict]
        ax.plot(xs, ys, color=STRICT_COLOR, linestyle="--", linewidth=1.5, label="strict law")
    if curve.metric != "ppl" and curve.protocol.chance is not None:
        ax.axhline(curve.protocol.chance, color="#777777", linestyle=":", linewidth=1, label="chance")
    ax.scatter(
        [p.sparsity for p in curve.measured],
        [p.value for p in curve.measured],
        color=MEASURED_COLOR,
        zorder=5,
        s=28,
        label=curve.source,
    )
    ax.set_xlim(0.0, 0.9)
    ax.set_ylim(low, high)
    ax.set_xlabel("sparsity (fraction removed)")
    ylabel = "perplexity (log scale)" if curve.metric == "ppl" else f"{curve.metric} (fraction correct)"
    ax.set_ylabel(ylabel)
    ax.set_title("\n".join(textwrap.wrap(title_of(curve), 80)), fontsize=9, parse_math=False)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper left" if curve.metric == "ppl" else "lower left", fontsize=8)
    return fig


def _simulated(ax: Any, curve: CurvePublic, low: float, high: float) -> None:
    """A simulate job's series: its face values (with their sampling band) and its anchored curve, each
    drawn from the dense point, which a simulation at s = 0 reproduces."""
    dense = [(p.sparsity, p.value) for p in curve.measured if p.sparsity == 0.0][:1]
    if curve.simulated:
        xs = [p.sparsity for p in curve.simulated]
        if any(p.low is not None for p in curve.simulated):
            lo = [p.low if p.low is not None else p.value or low for p in curve.simulated]
            hi = [p.high if p.high is not None else p.value or high for p in curve.simulated]
            ax.fill_between(xs, lo, hi, color=SIMULATED_COLOR, alpha=0.15, linewidth=0)
        xs, ys = _from_dense(dense, curve.simulated)
        ax.plot(xs, ys, color=SIMULATED_COLOR, linestyle=":", marker="^", markersize=4, label="simulated")
    if curve.anchored:
        xs, ys = _from_dense(dense, curve.anchored)
        ax.plot(xs, ys, color=ANCHORED_COLOR, marker="s", markersize=4, label="simulated, anchored")


def _answer(ax: Any, curve: CurvePublic, low: float, high: float) -> None:
    """What POST /v1/predictions answers along the grid, from the dense point: the boldest line, with
    its band, labelled with the rungs it came from."""
    if not curve.answer:
        return
    dense = [(p.sparsity, p.value) for p in curve.measured if p.sparsity == 0.0][:1]
    xs = [p.sparsity for p in curve.answer]
    lo = [p.low if p.low is not None else math.nan for p in curve.answer]
    hi = [p.high if p.high is not None else math.nan for p in curve.answer]
    ax.fill_between(xs, lo, hi, color=ANSWER_COLOR, alpha=0.10, linewidth=0)
    rungs = ", ".join(dict.fromkeys(str(p.rung) for p in curve.answer))
    xs, ys = _from_dense(dense, curve.answer)
    ax.plot(xs, ys, color=ANSWER_COLOR, linewidth=2.6, label=f"the answer ({rungs})", zorder=4)


def _from_dense(dense: list[tuple[float, float]], points: list[Any]) -> tuple[list[float], list[float]]:
    """(sparsities, values) of a series, led by the dense point when there is one."""
    pairs = dense + [(p.sparsity, p.value if p.value is not None else math.nan) for p in points]
    return [s for s, _ in pairs], [v for _, v in pairs]


def curve_svg(curve: CurvePublic) -> str:
    """The curve as a standalone SVG document."""
    buffer = io.StringIO()
    figure(curve).savefig(buffer, format="svg", metadata={"Date": None})
    return buffer.getvalue()


def inline_svg(curve: CurvePublic) -> str:
    """The SVG element alone (no XML prolog or DOCTYPE), to embed in an HTML page."""
    svg = curve_svg(curve)
    return svg[svg.index("<svg") :]


def curve_png(curve: CurvePublic) -> bytes:
    """The curve as a PNG image."""
    buffer = io.BytesIO()
    figure(curve).savefig(buffer, format="png", dpi=PNG_DPI, metadata={"Software": None})
    return buffer.getvalue()
