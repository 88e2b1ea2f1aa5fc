"""A profile drawn as a heatmap: the share of each signal's normalised-token energy that slicing to
width d would discard, signals down the stream (rows) against d (columns), on a log colour scale;
or, for one mask rule, the share of each block linear's output energy its mask removes (rows:
linears in block order, columns: the profiled sparsities). Rendered like the curves
(`app.views.curve_plots`): Agg canvas, object-oriented API, text kept text."""

from __future__ import annotations

import io
import math
from typing import TYPE_CHECKING

from app.views.curve_plots import load_matplotlib
from core.profiles import StoredProfile

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

WIDTH_IN, HEIGHT_IN = 7.5, 6.0
PNG_DPI = 110
FLOOR = 1e-6  # shares below this are drawn as the floor colour


def heatmap_grid(profile: StoredProfile) -> tuple[list[int], list[list[float]]]:
    """(widths, shares[signal][width]): every multiple of round_to from it up to D."""
    step = profile.round_to
    widths = list(range(step, profile.row.hidden_size + 1, step))
    return widths, [[max(signal.token_discarded(d), FLOOR) for d in widths] for signal in profile.signals]


def _log_heatmap(
    rows: list[list[float]],
    vmin: float,
    vmax: float,
    label: str,
    extent: tuple[float, float, float, float] | None = None,
) -> tuple[Figure, Axes]:
    """A figure with `rows` drawn on a log colour scale from `vmin` to `vmax`, and its colour bar."""
    load_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import LogNorm
    from matplotlib.figure import Figure

    fig = Figure(figsize=(WIDTH_IN, HEIGHT_IN), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    image = ax.imshow(
        rows,
        aspect="auto",
        origin="upper",
        norm=LogNorm(vmin=vmin, vmax=vmax),
        extent=extent,
        cmap="magma_r",
    )
    fig.colorbar(image, ax=ax, label=label)
    return fig, ax


def _mask_figure(profile: StoredProfile, rule: str) -> Figure:
    sparsities = profile.row.sparsities
    rows = [[max(linear.error(rule, s), FLOOR) for s in sparsities] for linear in profile.linears]
    floor = max(FLOOR, min(min(row) for row in rows))
    fig, ax = _log_heatmap(rows, floor, 1.0, "share of output energy removed (log)")
    ax.set_xticks(range(len(sparsities)), [f"{s:g}" for s in sparsities], fontsize=7)
    ticks = list(range(0, len(rows), max(1, math.ceil(len(rows) / 14))))
    names = [f"{linear.layer} {linear.name}" for linear in profile.linears]
    ax.set_yticks(ticks, [names[i] for i in ticks], fontsize=7)
    ax.set_xlabel("sparsity")
    ax.set_title(
        f"{profile.row.model_id}: what the {rule} mask removes from each block linear's output",
        fontsize=9,
        parse_math=False,
    )
    return fig


def _figure(profile: StoredProfile, rule: str | None = None) -> Figure:
    if rule is not None:
        if not profile.offers_rule(rule):
            raise ValueError(f"this profile has no {rule!r} mask errors")
        return _mask_figure(profile, rule)
    widths, shares = heatmap_grid(profile)
    half = profile.round_to / 2
    fig, ax = _log_heatmap(
        shares,
        FLOOR,
        max(1.0, max(max(row) for row in shares)),
        "share of token energy discarded (log)",
        extent=(widths[0] - half, widths[-1] + half, len(shares) - 0.5, -0.5),
    )
    for width in profile.row.widths:
        ax.axvline(width, color="#1f5fa8", linewidth=0.8, alpha=0.7)
    # The profile's sparsities label their widths on a top axis of their own, which the constrained
    # layout keeps clear of the title (text placed in data space ran into it).
    top = ax.secondary_xaxis("top")
    labels = [f"s={sparsity:g}" for sparsity in profile.row.sparsities]
    top.set_xticks(list(profile.row.widths), labels, fontsize=7, color="#1f5fa8")
    top.tick_params(axis="x", colors="#1f5fa8", length=2)
    ticks = list(range(0, len(shares), max(1, math.ceil(len(shares) / 12))))
    ax.set_yticks(ticks, [profile.signals[i].name for i in ticks], fontsize=7)
    ax.set_xlabel("kept width d")
    ax.set_title(
        f"{profile.row.model_id}: what slicing to width d discards, per signal", fontsize=9, parse_math=False
    )
    return fig


def profile_svg(profile: StoredProfile, rule: str | None = None) -> str:
    """The slicing heatmap, or with `rule` its mask errors (ValueError: the profile has none)."""
    buffer = io.StringIO()
    _figure(profile, rule).savefig(buffer, format="svg", metadata={"Date": None})
    return buffer.getvalue()


def profile_png(profile: StoredProfile, rule: str | None = None) -> bytes:
    buffer = io.BytesIO()
    _figure(profile, rule).savefig(buffer, format="png", dpi=PNG_DPI, metadata={"Software": None})
    return buffer.getvalue()
