"""Probe points written straight into the store, as a probe job would write them."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from core.store import Store
from core.tables import ProbePoint
from tests.app.store_points import add_job

SPACES = ("embedding", "logits", "probs")
SUBLAYERS = ("attention", "mlp", "block")


def add_probe_points(store: Store, job_id: str, points: Iterable[dict[str, Any]]) -> list[int]:
    """Rows of `probe_points` (keys: probe, layer, sublayer, space, step, metric, value, estimate);
    returns their ids in order."""
    rows = [ProbePoint(job_id=job_id, **point) for point in points]
    with store.session() as session:
        session.add_all(rows)
        session.flush()
        return [row.id for row in rows]


def counterfactual_points(layers: int, sublayers: Iterable[str] = SUBLAYERS) -> list[dict[str, Any]]:
    """Per layer and sublayer: 1-cos in every space and KL of probs, growing with depth (spanning
    decades, as real ones do), with an estimate that is close but not exact."""
    points = []
    for sublayer in sublayers:
        for layer in range(layers):
            for space, metric in [*((space, "1-cos") for space in SPACES), ("probs", "kl")]:
                value = 1e-4 * 10 ** (layer * 0.8) * (1 + SPACES.index(space))
                estimate = value * (1.0 + 0.1 * math.sin(layer + len(space)))
                points.append(
                    {
                        "probe": "counterfactual",
                        "layer": layer,
                        "sublayer": sublayer,
                        "space": space,
                        "step": None,
                        "metric": metric,
                        "value": value,
                        "estimate": estimate,
                        "n": 40,
                        "stderr": value / 10,
                        "value_min": value / 5,
                        "value_max": value * 5,
                    }
                )
    return points


def generation_points(layers: int, steps: int) -> list[dict[str, Any]]:
    """Greedy and sampled runs: per-layer embedding 1-cos per step (heatmap), and at the output
    (layer null) 1-cos per space, KL of probs and the token metrics per step."""
    points: list[dict[str, Any]] = []
    for probe, scale in (("generation-greedy", 1.0), ("generation-sampled", 2.0)):
        for step in range(steps):
            for layer in range(layers):
                points.append(
                    _gen(probe, layer, "embedding", step, "1-cos", scale * 0.01 * (1 + layer) * (1 + step))
                )
            for space in SPACES:
                points.append(_gen(probe, None, space, step, "1-cos", scale * 0.02 * (1 + step)))
            points.append(_gen(probe, None, "probs", step, "kl", scale * 0.05 * (1 + step)))
            points.append(_gen(probe, None, "tokens", step, "agree", float(step % 3 != 2)))
            points.append(_gen(probe, None, "tokens", step, "prefix_agree", float(step < 2)))
    return points


def _gen(probe: str, layer: int | None, space: str, step: int, metric: str, value: float) -> dict[str, Any]:
    return {
        "probe": probe,
        "layer": layer,
        "sublayer": None,
        "space": space,
        "step": step,
        "metric": metric,
        "value": value,
        "estimate": None,
        "n": None,
        "stderr": None,
        "value_min": None,
        "value_max": None,
    }


@dataclass
class SeededProbeJob:
    job_id: str
    points: list[dict[str, Any]]
    ids: list[int] = field(default_factory=list)


def probe_job(
    store: Store, model: str = "facebook/opt-125m", layers: int = 4, steps: int = 5
) -> SeededProbeJob:
    """A succeeded probe job with counterfactual and generation points."""
    job_id = add_job(store, model, kind="probe", method="wanda", sparsity=0.5, pattern="2:4")
    points = counterfactual_points(layers) + generation_points(layers, steps)
    return SeededProbeJob(job_id, points, add_probe_points(store, job_id, points))
