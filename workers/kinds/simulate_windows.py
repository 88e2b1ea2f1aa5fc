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

With `cheap` (SliceGPT on a float32 model where bfloat16 is native, or a mask method whose job asks
for it: `workers.simulation.cheap_windows`) the further windows run on a bfloat16 copy, each corrected
by the dense model's own bfloat16 gap on it; the dense model's bfloat16 windows are kept with its
baseline, so each is scored once (`workers.kinds.dense_windows`). A curve with such a copy and no
anchor scores its pilot there too (`pilot_in_pass`): the pass then makes only the bases or the
statistics, and each face value's pilot is its first windows on the copy, which cost about two thirds
of a float32 one.
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
from workers.simulation import SIMULATED, SimulatedPoint, SimulationReport
from workers.simulation.cheap_windows import CheapWindows, resolve_window_dtype
from workers.simulation.whole_models import MaskedModel, ProjectedModel, SimulatedModel

PointKey = tuple[float, str]
"""A simulated point by (sparsity, role)."""


def window_copy_dtype(spec: SimulateJobCreate, prepared: Prepared) -> torch.dtype | None:
    """The dtype of the copy a face value's windows run on (`resolve_window_dtype`); None where they
    run on the job's model itself (the stock layout; a mask method unless its job asks)."""
    if spec.layout == STOCK_LAYOUT:
        return None
    if METHODS[spec.method].simulation is not Simulation.projection and spec.window_dtype is None:
        return None  # a mask simulation stays the method itself unless asked
    return resolve_window_dtype(spec.window_dtype, prepared.loaded.model, prepared.loaded.device)


def pilot_in_pass(spec: SimulateJobCreate, copy_dtype: torch.dtype | None) -> bool:
    """Whether the simulation's pass scores the pilot. An anchor rests on it (paired with its face
    value on those very windows, in the model's dtype), so with anchors it stays there; without, a
    face value that has a copy scores its pilot on the copy too, where a window costs about two thirds
    of one through the pass's float32 blocks (bench/README.md, `precision_curves.py`)."""
    return copy_dtype is None or bool(spec.anchors)


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
    *,
    copy_dtype: torch.dtype | None,
    pilot_size: int,
) -> dict[PointKey, WindowEstimate]:
    """Every point of a simulate job to its precision, paired with the dense baseline's per-window NLL;
    SliceGPT's windows past the pass on a `copy_dtype` copy (`window_copy_dtype`, recorded in `report`),
    the pilot's `pilot_size` windows among them where the pass scored none."""
    dense_windows = prepared.dense.protocol.get("window_nll") or []
    if len(dense_windows) != windows.shape[0]:
        raise JobFailure(
            f"the dense baseline (result {prepared.dense.id}) kept {len(dense_windows)} per-window NLLs "
            f"for a protocol of {windows.shape[0]} windows; simulate with precision null"
        )
    model, dense_id = prepared.loaded.model, prepared.dense.id
    cheap, key = None, ""
    if copy_dtype is not None:
        key = scored_on(copy_dtype, prepared.loaded.device)
        known = context.read(
            lambda session: stored_dense_windows(session, dense_id, key), "reading the dense windows"
        )
        cheap = CheapWindows(
            model,
            copy_dtype,
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
            pilot_size=pilot_size,
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
    pilot_size: int | None = None,
) -> dict[PointKey, WindowEstimate]:
    """Each point's estimate for the full-window value of `windows` (W, T), its pilot being the first
    windows of `order`: those the report's points scored, or where the pass scored none the first
    `pilot_size`, scored here through each face value's whole model; face values refined to
    `precision`, their windows on `cheap`'s copy where given."""
    models = {simulated.sparsity: simulated for simulated in report.models}
    population = windows.shape[0]
    found: dict[PointKey, WindowEstimate] = {}
    faces = [point for point in report.points if point.role == SIMULATED]
    pilots = {_key(point): point.scores.per_window for point in report.points}
    passed = len(report.points[0].scores.per_window) if report.points else 0
    pilot = list(order[: passed or pilot_size or 0])
    off_pass = not passed and bool(report.points)
    report.pilot_on_copy = off_pass and cheap is not None
    if off_pass:
        if (
            pilot_size is None
            or len(faces) < len(report.points)
            or any(f.sparsity not in models for f in faces)
        ):
            raise ValueError(
                "a pilot off the pass needs pilot_size and every point a face value with its model"
            )
        for position, face in enumerate(faces):
            context.report(
                "scoring windows",
                stage_progress(start, end, position, len(faces)),
                f"s={face.sparsity:g} ({position + 1}/{len(faces)}): the pilot's {len(pilot)} windows",
            )
            with _scoring(models[face.sparsity], model, windows, batch_size, context, cheap) as score:
                pilots[_key(face)] = list(score(pilot))
    if all(face.sparsity in models for face in faces):
        reference = choose_reference(
            {face.sparsity: pilots[_key(face)] for face in faces},
            [dense_window_nll[index] for index in pilot],
            population,
            precision,
        )
    else:  # no whole model kept: the pilot is all there is
        reference = None
    covariate, paired_with = dense_window_nll, DENSE_PAIRING
    faces.sort(key=lambda face: face.sparsity != reference)  # the reference first
    for position, point in enumerate(faces):
        scored = pilots[_key(point)]
        simulated = models.get(point.sparsity)
        low = stage_progress(start, end, position, len(faces))
        high = stage_progress(start, end, position + 1, len(faces))
        prefix = f"s={point.sparsity:g} ({position + 1}/{len(faces)}): "
        if simulated is None:
            found[_key(point)] = estimate(pilot, scored, population, dense_window_nll)
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
        found[_key(point)] = estimated
        if is_reference:
            covariate, paired_with = by_index(estimated), reference_label(point.sparsity)
    for point in report.points:
        if point.role != SIMULATED:
            found[_key(point)] = estimate(pilot, pilots[_key(point)], population, dense_window_nll)
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
    """`simulated`'s window scorer: on `cheap`'s copy where given (a projection applied per call, masks
    for the length of the `with`), else on `model` with `simulated` applied for the `with`."""
    if cheap is not None and isinstance(simulated, ProjectedModel):
        yield cheap.scorer(simulated)
        return
    if cheap is not None and isinstance(simulated, MaskedModel):
        with cheap.masked_scorer(simulated) as score:
            yield score
        return
    with simulated.applied(model):
        yield window_scorer(model, windows, batch_size=batch_size, should_stop=context.should_stop)


def _key(point: SimulatedPoint) -> PointKey:
    return (point.sparsity, point.role)


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
