"""A simulated curve to a precision: each sparsity's windows paired with the dense model's, a few at a
time, until its band on the full-window PPL is as narrow as the job asked (`core.prediction.paired_windows`).

The simulation's block-by-block pass scores a pilot (the first windows of the seeded order) for every
track at once; a face value whose band is still too wide is then scored on further windows of that
order through its whole simulated model (`workers.simulation.whole_models`: the same arithmetic, the
model's own forward), so a curve costs one pass over the pilot plus only the windows it needs. An
anchor (the method itself, `role: anchor`) rests on the pilot: it is paired with its face value on
those very windows when the curve is scaled through it.

The face values are paired with the dense model's windows, or, where the pilot says that costs fewer
windows (`core.prediction.curve_pairing`: slicing's damage differs much from window to window), the
curve's middle point is scored on every window first and the others are paired with it.

With `cheap` (SliceGPT on a float32 model where bfloat16 is native: `workers.simulation.cheap_windows`)
the further windows run on a bfloat16 copy, each corrected by the dense model's own bfloat16 gap on it;
the dense model's bfloat16 windows are kept with its baseline, so each is scored once
(`workers.kinds.dense_windows`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from core.methods import METHODS, STOCK_LAYOUT, Simulation
from core.prediction.curve_pairing import choose_reference
from core.prediction.paired_windows import (
    DENSE_PAIRING,
    WindowEstimate,
    WindowScorer,
    estimate,
    estimate_sequentially,
)
from core.specs.simulate import SimulateJobCreate
from workers.context import JobContext, JobFailure
from workers.evaluation.perplexity import EvaluationStopped
from workers.evaluation.sampled_perplexity import window_scorer
from workers.kinds.dense_windows import scored_on, store_dense_windows, stored_dense_windows
from workers.kinds.job_data import Prepared
from workers.kinds.steps import band_reporter, stage_progress
from workers.simulation import SIMULATED, SimulationReport
from workers.simulation.cheap_windows import CheapWindows, resolve_window_dtype
from workers.simulation.whole_models import ProjectedModel, SimulatedModel

PointKey = tuple[float, str]
"""A simulated point by (sparsity, role)."""


def refine_to_precision(
    context: JobContext,
    prepared: Prepared,
    spec: SimulateJobCreate,
    report: SimulationReport,
    windows: torch.Tensor,
    order: list[int],
    precision: float,
    start: float,
    end: float,
) -> dict[PointKey, WindowEstimate]:
    """Every point of a simulate job to its precision, paired with the dense baseline's per-window NLL;
    SliceGPT's further windows on a cheaper copy where `resolve_window_dtype` says (recorded in `report`)."""
    dense_windows = prepared.dense.protocol.get("window_nll") or []
    if len(dense_windows) != windows.shape[0]:
        raise JobFailure(
            f"the dense baseline (result {prepared.dense.id}) kept {len(dense_windows)} per-window NLLs "
            f"for a protocol of {windows.shape[0]} windows; simulate with precision null"
        )
    model, dense_id = prepared.loaded.model, prepared.dense.id
    cheap, key = None, ""
    if METHODS[spec.method].simulation is Simulation.projection and spec.layout != STOCK_LAYOUT:
        dtype = resolve_window_dtype(spec.window_dtype, model, prepared.loaded.device)
        if dtype is not None:
            key = scored_on(dtype, prepared.loaded.device)
            known = context.read(
                lambda session: stored_dense_windows(session, dense_id, key), "reading the dense windows"
            )
            cheap = CheapWindows(
                model,
                dtype,
                windows,
                dense_windows,
                batch_size=spec.perplexity.batch_size,
                should_stop=context.should_stop,
                known=known,
            )
    try:
        return refine_points(
            context,
            model,
            report,
            windows,
            order,
            dense_windows,
            precision,
            batch_size=spec.perplexity.batch_size,
            start=start,
            end=end,
            cheap=cheap,
        )
    except EvaluationStopped:
        context.check_stop()
        raise
    finally:
        ran = cheap is not None and cheap.ran  # the pilot may have been every window
        report.window_dtype = str(cheap.dtype if cheap and ran else model.dtype).removeprefix("torch.")
        if cheap is not None and ran:
            report.timings["cheap_windows"] = cheap.seconds
            report.timings["cheap_windows_dense"] = cheap.dense_seconds
            report.dense_windows = {"scored": cheap.dense_windows, "reused": cheap.dense_reused}
            scored = dict(cheap.dense_scored)  # kept even when the job stops: they are right
            context.write_cache(
                lambda session: store_dense_windows(session, dense_id, key, scored),
                "keeping the dense windows",
            )


def refine_points(
    context: JobContext,
    model: torch.nn.Module,
    report: SimulationReport,
    windows: torch.Tensor,
    order: Sequence[int],
    dense_window_nll: Sequence[float],
    precision: float,
    *,
    batch_size: int,
    start: float,
    end: float,
    cheap: CheapWindows | None = None,
) -> dict[PointKey, WindowEstimate]:
    """Each point's estimate for the full-window value of `windows` (W, T), its pilot being the first
    windows of `order` (what the report's points scored); face values refined to `precision`, their
    further windows on `cheap`'s copy where given."""
    pilot = list(order[: len(report.points[0].scores.per_window)]) if report.points else []
    models = {simulated.sparsity: simulated for simulated in report.models}
    population = windows.shape[0]
    found: dict[PointKey, WindowEstimate] = {}
    faces = [point for point in report.points if point.role == SIMULATED]
    if all(face.sparsity in models for face in faces):
        reference = choose_reference(
            {face.sparsity: face.scores.per_window for face in faces},
            [dense_window_nll[index] for index in pilot],
            population,
            precision,
        )
    else:  # no whole model kept: the pilot is all there is
        reference = None
    covariate, paired_with = dense_window_nll, DENSE_PAIRING
    faces.sort(key=lambda face: face.sparsity != reference)  # the reference first
    for position, point in enumerate(faces):
        scored = point.scores.per_window
        simulated = models.get(point.sparsity)
        low = stage_progress(start, end, position, len(faces))
        high = stage_progress(start, end, position + 1, len(faces))
        prefix = f"s={point.sparsity:g} ({position + 1}/{len(faces)}): "
        if simulated is None:
            found[(point.sparsity, point.role)] = estimate(pilot, scored, population, dense_window_nll)
            continue
        is_reference = point.sparsity == reference
        with _scoring(simulated, model, windows, batch_size, context, cheap) as score:
            estimated = estimate_sequentially(
                score,
                order,
                None if is_reference else precision,
                covariate,
                scored=scored,
                paired_with=paired_with,
                progress=band_reporter(
                    context,
                    "scoring windows",
                    low,
                    high,
                    prefix + ("every window, the reference: " if is_reference else ""),
                ),
            )
        found[(point.sparsity, point.role)] = estimated
        if is_reference:
            covariate, paired_with = by_index(estimated), reference_label(point.sparsity)
    for point in report.points:
        if point.role != SIMULATED:
            found[(point.sparsity, point.role)] = estimate(
                pilot, point.scores.per_window, population, dense_window_nll
            )
    return found


@contextmanager
def _scoring(
    simulated: SimulatedModel,
    model: torch.nn.Module,
    windows: torch.Tensor,
    batch_size: int,
    context: JobContext,
    cheap: CheapWindows | None,
) -> Iterator[WindowScorer]:
    """`simulated`'s window scorer: on `cheap`'s copy (which applies it per call) for a projected
    model, else on `model` with `simulated` applied for the length of the `with`."""
    if cheap is not None and isinstance(simulated, ProjectedModel):
        yield cheap.scorer(simulated)
        return
    with simulated.applied(model):
        yield window_scorer(model, windows, batch_size=batch_size, should_stop=context.should_stop)


def by_index(found: WindowEstimate) -> list[float]:
    """Every window's mean NLL by window index, from an estimate that scored every window."""
    values = [0.0] * found.of_windows
    for index, nll in zip(found.indices, found.window_nll, strict=True):
        values[index] = nll
    return values


def reference_label(sparsity: float) -> str:
    """`paired_with` of the points paired with the reference point at `sparsity`."""
    return f"the simulated point at s={sparsity:g}"


def pilot_windows(order: Sequence[int], first: int) -> list[int]:
    """The windows the simulation's pass scores for every track: the first of the seeded order."""
    return list(order[: min(first, len(order))])
