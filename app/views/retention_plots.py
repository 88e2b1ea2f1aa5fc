"""The retention view drawn: one group of bars per pruning (method at sparsity), the mean retained
multiple-choice, generative and perplexity scores with their stderr, each task a dot on its bar, and
a line at 1 (unchanged). Rendered like the curves (`app.views.curve_plots`): Agg, text kept text."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from app.schemas.retention import RetentionPublic
from app.views.curve_plots import load_matplotlib

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PNG_DPI = 110
FAMILIES = (
    ("multiple_choice", "multiple choice (acc)", "#1f5fa8"),
    ("generative", "generative (LAMBADA acc, GSM8K exact match)", "#c8551b"),
    ("perplexity", "perplexity (dense / pruned)", "#6b6b6b"),
)
BAR_WIDTH = 0.26


class NothingToDraw(ValueError):
    """The model has no pruning with a paired dense result."""


def _figure(view: RetentionPublic) -> Figure:
    if not view.prunings:
        raise NothingToDraw(f"model {view.model!r} has no pruned result with a paired dense one")
    load_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(6.0, 1.3 * len(view.prunings) + 2.5), 4.6), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for offset, (family, label, colour) in zip((-1, 0, 1), FAMILIES, strict=True):
        xs, heights, errors = [], [], []
        for x, pruning in enumerate(view.prunings):
            mean = next((m for m in pruning.means if m.family == family), None)
            if mean is None:
                continue
            xs.append(x + offset * BAR_WIDTH)
            heights.append(mean.retained)
            errors.append(mean.stderr or 0.0)
            dots = [s.retained for s in pruning.scores if s.family == family]
            ax.plot([x + offset * BAR_WIDTH] * len(dots), dots, "o", color="black", markersize=3, alpha=0.6)
        ax.bar(xs, heights, BAR_WIDTH, yerr=errors, color=colour, alpha=0.85, label=label, capsize=3)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(
        range(len(view.prunings)), [f"{p.method}\ns={p.sparsity:.3g}" for p in view.prunings], fontsize=8
    )
    ax.set_ylabel("retained (1 = dense)")
    ax.set_ylim(0.0, max(1.1, ax.get_ylim()[1]))
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)
    ax.set_title(f"{view.model}: what each pruning keeps", fontsize=9, parse_math=False)
    return fig


def retention_svg(view: RetentionPublic) -> str:
    buffer = io.StringIO()
    _figure(view).savefig(buffer, format="svg", metadata={"Date": None})
    return buffer.getvalue()


def retention_png(view: RetentionPublic) -> bytes:
    buffer = io.BytesIO()
    _figure(view).savefig(buffer, format="png", dpi=PNG_DPI, metadata={"Software": None})
    return buffer.getvalue()
