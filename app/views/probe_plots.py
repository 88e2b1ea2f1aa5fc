"""Probe plots as SVG and PNG: where pruning bends the model, layer by layer and step by step.

Three views over a probe job's points (docs/science.md §3):

- `layers`: one panel per space (embedding, logits, probs at the chosen metric, plus KL of probs),
  the measured deviation per layer beside its Taylor estimate (log y axis when values span decades);
- `heatmap`: layer x generation step of the embedding-space deviation of a generation probe;
- `generation`: per generation step, KL and 1 - cos per space, and token agreement, for the greedy
  and the sampled run.

Same conventions as app.views.curve_plots (matplotlib imported lazily, Agg canvas, object-oriented API only).
Every line and panel carries an SVG id (`truth-<space>-<metric>`, `panel-<...>`) so clients and
tests can find them.
"""

from __future__ import annotations

import io
import math
import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from app.schemas.probes import ProbePointPublic
from app.views.curve_plots import PNG_DPI, load_matplotlib
from core.specs.probe import PROBE_SPACES

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

ProbeView = Literal["layers", "heatmap", "generation"]
PROBE_VIEWS: tuple[str, ...] = ("layers", "heatmap", "generation")
DEFAULT_PROBE = {"layers": "counterfactual", "heatmap": "generation-greedy"}
GENERATION_PROBES = ("generation-greedy", "generation-sampled")
TOKEN_METRICS = ("agree", "prefix_agree")
DECADES_FOR_LOG = 100.0
"""Draw a log axis when the largest positive value is at least this many times the smallest."""

TRUTH_COLOR = "#111111"
ESTIMATE_COLOR = "#c0392b"
SPACE_COLORS = {"embedding": "#1f5fa8", "logits": "#2e8b57", "probs": "#c0392b"}
PROBE_STYLES = {"generation-greedy": "-", "generation-sampled": "--"}


class NoProbePoints(LookupError):
    """The job has no points for this view; the message says which were looked for."""


@dataclass(frozen=True)
class Line:
    label: str
    gid: str
    xs: list[float]
    ys: list[float]
    color: str
    style: str = "-"
    band: tuple[list[float], list[float]] | None = None  # (low, high) per x: mean -/+ 2 stderr


@dataclass(frozen=True)
class Panel:
    gid: str
    title: str
    xlabel: str
    ylabel: str
    lines: list[Line]


def _mean_by(
    points: Iterable[ProbePointPublic], x: Callable[[ProbePointPublic], int | None], y: str = "value"
) -> tuple[list[float], list[float]]:
    """Mean of `y` per x (several prompts may share a layer or step), x ascending; non-finite dropped."""
    sums: dict[int, list[float]] = {}
    for point in points:
        key, value = x(point), getattr(point, y)
        if key is not None and value is not None and math.isfinite(value):
            sums.setdefault(key, []).append(value)
    keys = sorted(sums)
    return [float(k) for k in keys], [math.fsum(sums[k]) / len(sums[k]) for k in keys]


def _band(
    points: Sequence[ProbePointPublic], xs: list[float], ys: list[float]
) -> tuple[list[float], list[float]] | None:
    """mean -/+ 2 stderr per layer where every layer's points carry a stderr (the low edge kept above
    zero so that a log axis can show it); None for points stored without their spread."""
    stderr_xs, stderrs = _mean_by(points, lambda p: p.layer, "stderr")
    if stderr_xs != xs or not xs:
        return None
    low = [max(y - 2 * e, y / 10 if y > 0 else y - 2 * e) for y, e in zip(ys, stderrs, strict=True)]
    return low, [y + 2 * e for y, e in zip(ys, stderrs, strict=True)]


def _spans_decades(values: Sequence[float]) -> bool:
    return bool(values) and min(values) > 0 and max(values) / min(values) >= DECADES_FOR_LOG


def layers_panels(points: Sequence[ProbePointPublic], probe: str, sublayer: str, metric: str) -> list[Panel]:
    """Measured deviation and Taylor estimate per layer, one panel per space (plus probs KL): on the
    prompts, or the mean over decoding steps where the job read only those."""
    wanted = [(space, metric) for space in PROBE_SPACES]
    if metric != "kl":
        wanted.append(("probs", "kl"))
    candidates = [p for p in points if p.probe == probe and p.sublayer == sublayer and p.layer is not None]
    # Prompt points where there are any: decoding-step points (with a step) are another measurement.
    # A probe that read only decoding steps (the released-code convention) is drawn as their mean.
    chosen = [p for p in candidates if p.step is None] or candidates
    panels = []
    for space, what in wanted:
        group = [p for p in chosen if p.space == space and p.metric == what]
        if not group:
            continue
        xs, ys = _mean_by(group, lambda p: p.layer)
        lines = [Line("measured", f"truth-{space}-{what}", xs, ys, TRUTH_COLOR, band=_band(group, xs, ys))]
        xs, ys = _mean_by(group, lambda p: p.layer, "estimate")
        if xs:
            lines.append(Line("Taylor estimate", f"estimate-{space}-{what}", xs, ys, ESTIMATE_COLOR, "--"))
        panels.append(Panel(f"panel-{space}-{what}", f"{space}: {what}", "layer", what, lines))
    if not panels:
        raise NoProbePoints(f"no {probe} points of sublayer {sublayer!r} with metric {metric!r} or kl")
    return panels


def heatmap_grid(
    points: Sequence[ProbePointPublic], probe: str, metric: str
) -> tuple[list[int], list[int], list[list[float]]]:
    """Layers, steps and the layer x step grid (NaN where no point) of embedding-space `metric`."""
    cells: dict[tuple[int, int], list[float]] = {}
    for p in points:
        wanted = p.probe == probe and p.space == "embedding" and p.metric == metric
        if wanted and p.layer is not None and p.step is not None and math.isfinite(p.value):
            cells.setdefault((p.layer, p.step), []).append(p.value)
    if not cells:
        raise NoProbePoints(f"no per-layer {probe} points of embedding {metric!r} by generation step")
    layers = sorted({layer for layer, _ in cells})
    steps = sorted({step for _, step in cells})
    grid = [
        [
            math.fsum(cells[(layer, step)]) / len(cells[(layer, step)])
            if (layer, step) in cells
            else math.nan
            for step in steps
        ]
        for layer in layers
    ]
    return layers, steps, grid


def _output_level(points: Sequence[ProbePointPublic]) -> list[ProbePointPublic]:
    """The model's output: points without a layer, or else those of the last layer stored."""
    without = [p for p in points if p.layer is None]
    if without:
        return without
    last = max((p.layer for p in points if p.layer is not None), default=None)
    return [p for p in points if p.layer == last]


def generation_panels(points: Sequence[ProbePointPublic]) -> list[Panel]:
    """Per step: KL, 1 - cos per space and token agreement, greedy (solid) and sampled (dashed)."""
    kl: list[Line] = []
    cos: list[Line] = []
    tokens: list[Line] = []
    for probe in GENERATION_PROBES:
        run = probe.removeprefix("generation-")
        style = PROBE_STYLES[probe]
        mine = [p for p in points if p.probe == probe and p.step is not None]
        for space in PROBE_SPACES:
            for metric, target in (("kl", kl), ("1-cos", cos)):
                group = _output_level([p for p in mine if p.space == space and p.metric == metric])
                if group:
                    xs, ys = _mean_by(group, lambda p: p.step)
                    label = f"{space} {run}" if metric == "1-cos" else f"{space} KL {run}"
                    color = SPACE_COLORS.get(space, TRUTH_COLOR)
                    target.append(Line(label, f"{probe}-{space}-{metric}", xs, ys, color, style))
        for metric, color in zip(TOKEN_METRICS, ("#1f5fa8", "#c0392b"), strict=True):
            group = _output_level([p for p in mine if p.metric == metric])
            if group:
                xs, ys = _mean_by(group, lambda p: p.step)
                tokens.append(Line(f"{metric} {run}", f"{probe}-tokens-{metric}", xs, ys, color, style))
    panels = [
        Panel("panel-generation-kl", "KL(p_dense || p_pruned) per step", "generation step", "KL", kl),
        Panel("panel-generation-1-cos", "1 - cos per step", "generation step", "1 - cos", cos),
        Panel("panel-generation-tokens", "token agreement", "generation step", "fraction", tokens),
    ]
    panels = [panel for panel in panels if panel.lines]
    if not panels:
        raise NoProbePoints("no generation-greedy or generation-sampled points by generation step")
    return panels


def _draw_panel(ax: Axes, panel: Panel) -> None:
    ax.set_gid(panel.gid)
    shown: list[float] = []
    for line in panel.lines:
        (artist,) = ax.plot(
            line.xs,
            line.ys,
            color=line.color,
            linestyle=line.style,
            linewidth=1.6,
            marker=".",
            label=line.label,
        )
        artist.set_gid(line.gid)
        shown.extend(line.ys)
        if line.band is not None:
            ax.fill_between(
                line.xs, *line.band, color=line.color, alpha=0.15, linewidth=0, label="± 2 stderr"
            )
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    log = _spans_decades([v for v in shown if math.isfinite(v)])
    if log:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator())
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_title(panel.title, fontsize=9, parse_math=False)
    ax.set_xlabel(panel.xlabel)
    ax.set_ylabel(f"{panel.ylabel} (log scale)" if log else panel.ylabel)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7)


def _new_figure(width: float, height: float) -> Figure:
    load_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _title(fig: Figure, title: str) -> None:
    fig.suptitle("\n".join(textwrap.wrap(title, 100)), fontsize=10, parse_math=False)


def panels_figure(panels: list[Panel], title: str) -> Figure:
    """Panels in a grid of two columns (one column for a single panel)."""
    columns = 1 if len(panels) == 1 else 2
    rows = math.ceil(len(panels) / columns)
    fig = _new_figure(4.6 * columns, 3.3 * rows + 0.5)
    for index, panel in enumerate(panels):
        _draw_panel(fig.add_subplot(rows, columns, index + 1), panel)
    _title(fig, title)
    return fig


def heatmap_figure(
    layers: list[int], steps: list[int], grid: list[list[float]], metric: str, title: str
) -> Figure:
    from matplotlib.colors import LogNorm

    fig = _new_figure(8.0, 4.8)
    ax = fig.add_subplot()
    ax.set_gid("panel-heatmap")
    finite = [v for row in grid for v in row if math.isfinite(v)]
    norm = LogNorm(vmin=min(finite), vmax=max(finite)) if _spans_decades(finite) else None
    extent = (steps[0] - 0.5, steps[-1] + 0.5, layers[0] - 0.5, layers[-1] + 0.5)
    image = ax.imshow(
        grid, origin="lower", aspect="auto", interpolation="nearest", extent=extent, cmap="viridis", norm=norm
    )
    image.set_gid("heatmap")
    colorbar = fig.colorbar(image, ax=ax)
    colorbar.set_label(f"embedding {metric}")
    ax.set_xlabel("generation step")
    ax.set_ylabel("layer")
    _title(fig, title)
    return fig


def build_figure(
    view: str,
    points: Sequence[ProbePointPublic],
    *,
    probe: str | None,
    sublayer: str,
    metric: str,
    title: str,
) -> Figure:
    """The figure of one view; NoProbePoints when the job has none of its points."""
    if view == "layers":
        chosen = probe or DEFAULT_PROBE["layers"]
        panels = layers_panels(points, chosen, sublayer, metric)
        return panels_figure(panels, f"{title} - {chosen}, sublayer {sublayer}, truth vs Taylor estimate")
    if view == "heatmap":
        chosen = probe or DEFAULT_PROBE["heatmap"]
        layers, steps, grid = heatmap_grid(points, chosen, metric)
        return heatmap_figure(layers, steps, grid, metric, f"{title} - {chosen}, embedding {metric} by layer")
    if view == "generation":
        return panels_figure(
            generation_panels(points), f"{title} - generation divergence (greedy solid, sampled dashed)"
        )
    raise ValueError(f"unknown probe view {view!r}; known: {', '.join(PROBE_VIEWS)}")


def figure_svg(fig: Figure) -> str:
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", metadata={"Date": None})
    return buffer.getvalue()


def figure_png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=PNG_DPI, metadata={"Software": None})
    return buffer.getvalue()


def inline(svg: str) -> str:
    """The SVG element alone (no XML prolog or DOCTYPE), to embed in an HTML page."""
    return svg[svg.index("<svg") :]
