"""`simulate` jobs: a method's perplexity at every requested sparsity from passes over the dense model
(`workers.simulation`), stored as `simulated` points beside, never among, the measured ones.

Stages and the share of the job's progress each one covers:

    loading model   0.00-0.02
    dense baseline  0.02-0.10  reused from the store like a prune job's, else measured and stored
    calibration     0.10-0.12  the windows a prune of the same request would draw
    simulating      0.12-1.00  detail "(S sparsities, A anchors): block i/L", then every curve's
                               windows are read through the head (to 0.70 with `accuracy`); with a
                               `precision` (the default) the pass runs on an 8-window pilot to
                               halfway (with a bfloat16 copy and no anchors: on none, its pilot
                               scored on the copy next), then
    scoring windows            detail "s=<s> (j/S): window i of at most W, band ±x %": each face
                               value on further windows until its band reaches the precision
                               (`workers.kinds.simulate_windows`; on a bfloat16 copy for SliceGPT
                               where native, for a mask method where asked:
                               `workers.simulation.cheap_windows`)
    accuracy        0.70-1.00  with `accuracy`: each simulated sparsity's whole model scored on the
                               tasks, detail "s=<s> (j/S): <task> i/N"

Stored, per simulated sparsity: a `ppl` result with `source: simulated`, its perplexity protocol (the
same keys as a measured one, so it is found by protocol), the dense baseline it compares with, and
under `simulation` how it was made (engine, bases, windows, role) with its sampling band for the full
evaluation split when only part of it was scored. Per anchor: the method itself through the same
passes (`role: anchor`). With anchors, each simulated sparsity also gets the curve scaled through them
(`law: anchored`, `core.prediction.anchoring`). With `accuracy`, per simulated sparsity and task
metric: a result with `source: simulated` scored on that sparsity's whole simulated model
(`workers.simulation.whole_models`), beside the dense score it compares with.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from typing import Any

import torch

from core.methods import METHODS
from core.prediction.anchoring import ANCHORED_LAW, Anchor, AnchoredScale, fit_scale
from core.prediction.paired_windows import FIRST_WINDOWS, WindowEstimate, window_order
from core.prediction.sampling import sampled_band
from core.specs.common import AccuracySpec
from core.specs.simulate import SimulateJobCreate
from core.tables import SIMULATED_SOURCE, Result
from workers.context import JobContext, JobFailure
from workers.evaluation.perplexity import PerplexityResult, evaluation_windows
from workers.evaluation.task_scoring import ScoredTask
from workers.kinds.accuracy_steps import measure_accuracy
from workers.kinds.job_data import Prepared
from workers.kinds.prune_steps import PrepareSpans, lap, prepare
from workers.kinds.rows import compared_accuracy_results, perplexity_protocol, stored_method
from workers.kinds.simulate_windows import (
    PointKey,
    pilot_in_pass,
    pilot_windows,
    refine_to_precision,
    window_copy_dtype,
)
from workers.kinds.steps import stage_progress, step_reporter
from workers.offload import suspended
from workers.simulation import (
    ANCHOR,
    SIMULATED,
    SimulatedPoint,
    SimulationOptions,
    SimulationReport,
    SimulationStopped,
    simulate_curve,
)
from workers.simulation.streams_dtype import resolve_streams_dtype
from workers.simulation.whole_models import ProjectedModel, SimulatedModel

SPANS = PrepareSpans(load=0.01, baseline=(0.02, 0.10), calibration=(0.10, 0.12))
TASKS_START = 0.70
"""Where task scoring starts in the job's progress, when the job scores tasks."""
BAND_LEVEL = 0.95
Estimates = dict[PointKey, WindowEstimate]


def run(context: JobContext) -> None:
    spec = SimulateJobCreate.model_validate(context.request)
    started = time.perf_counter()
    prepared = prepare(context, spec, SPANS, spec.accuracy)
    data = prepared.data
    available = data.token_ids.numel() // data.seqlen  # the split's windows, which a band covers
    try:
        windows = evaluation_windows(data.token_ids, data.seqlen, spec.perplexity.max_windows)  # (W, T)
    except ValueError as error:
        raise JobFailure(f"perplexity: {error}") from error
    precision = spec.perplexity.precision
    order = None if precision is None else window_order(windows.shape[0], spec.seed)
    copy_dtype = None if order is None else window_copy_dtype(spec, prepared)
    if order is None:
        eval_ids = windows
    elif pilot_in_pass(spec, copy_dtype):
        eval_ids = windows[torch.tensor(pilot_windows(order, FIRST_WINDOWS))]
    else:  # the pilot runs on the copy with the further windows: the pass only makes the bases
        eval_ids = windows[:0]
    calibration = prepared.calibration
    model_dtype = prepared.loaded.model.dtype
    streams_dtype = resolve_streams_dtype(spec.basis_dtype, model_dtype, prepared.loaded.device)
    options = SimulationOptions(
        layout=spec.layout,
        bases=spec.basis_source,
        basis_windows=spec.sequential_windows((streams_dtype or model_dtype) == torch.bfloat16),
        streams_dtype=streams_dtype,
        round_to=spec.round_to,
        slice_head=spec.slice_head,
        calibration_batch_size=spec.calibration.batch_size,
        eval_batch_size=spec.perplexity.batch_size,
        keep_models=spec.accuracy is not None or precision is not None,
    )
    simulated_end = 1.0 if spec.accuracy is None else TASKS_START
    pass_end = simulated_end if order is None else (SPANS.calibration[1] + simulated_end) / 2
    detail = f"({len(spec.sparsities)} sparsities, {len(spec.anchors)} anchors): "
    context.report("simulating", SPANS.calibration[1], detail)
    simulating_started = time.perf_counter()
    try:
        with suspended(prepared.loaded.model):  # the simulation streams blocks itself
            report = simulate_curve(
                prepared.loaded.model,
                spec.method,
                eval_ids,
                spec.sparsities,
                anchors=spec.anchors,
                calibration_ids=None if calibration is None else calibration.input_ids,
                attention_mask=None if calibration is None else calibration.attention_mask,
                options=options,
                device=prepared.loaded.device,
                progress=step_reporter(
                    context, "simulating", SPANS.calibration[1], pass_end, "block", detail
                ),
                should_stop=context.should_stop,
            )
    except SimulationStopped:
        context.check_stop()
        raise
    except ValueError as error:  # UnsupportedArchitectureError included
        raise JobFailure(f"simulating: {error}") from error
    timings = {**prepared.timings, "simulate_s": lap(simulating_started)}
    estimates: Estimates = {}
    if order is not None and precision is not None:
        refining_started = time.perf_counter()
        estimates = refine_to_precision(
            context,
            prepared,
            spec,
            report,
            windows,
            order,
            precision,
            pass_end,
            simulated_end,
            copy_dtype=copy_dtype,
            pilot_size=FIRST_WINDOWS,
        )
        timings["windows_s"] = lap(refining_started)
    scored: list[tuple[SimulatedModel, list[ScoredTask]]] = []
    if spec.accuracy is not None:
        tasks_started = time.perf_counter()
        scored = _score_tasks(context, prepared, spec.accuracy, report, start=simulated_end, seed=spec.seed)
        timings["accuracy_s"] = lap(tasks_started)
    timings["total_s"] = lap(started)
    rows = simulated_results(prepared, spec, report, available, timings, estimates)
    rows += simulated_accuracy_results(prepared, spec, report, scored)
    context.add_results(rows)
    context.log.info(
        "simulation finished",
        method=spec.method,
        points=len(report.points),
        anchored=sum(row.law == ANCHORED_LAW for row in rows),
        timings=report.timings,
    )


def simulated_results(
    prepared: Prepared,
    spec: SimulateJobCreate,
    report: SimulationReport,
    available_windows: int,
    timings: dict[str, float],
    estimates: Estimates | None = None,
) -> list[Result]:
    """One `ppl` row per simulated point and anchor, and with anchors one `anchored` row per simulated
    sparsity; `estimates` (a job with a precision): each point's value and band from its windows paired
    with the dense model's. Raises JobFailure for a non-finite perplexity (nothing could be stored or
    fitted)."""
    dense = prepared.dense.value
    estimates = estimates or {}
    for point in report.points:
        found = estimates.get(_key(point))
        if not math.isfinite(point.scores.ppl if found is None else found.ppl):
            raise JobFailure(
                f"the simulated perplexity at sparsity {point.sparsity:g} is not finite "
                f"({point.scores.ppl}); simulate in float32 or at lower sparsities"
            )
    anchors = [
        Anchor(point.sparsity, simulated.scores.ppl, point.scores.ppl)
        for point in report.points
        if point.role == ANCHOR
        for simulated in [_face_at(report, point.sparsity)]
        if simulated is not None
    ]
    scale = fit_scale(anchors, dense)  # anchor and face on the same windows: paired
    rows = [
        _row(prepared, spec, report, point, available_windows, timings, estimates.get(_key(point)))
        for point in report.points
    ]
    if scale is not None:
        rows += [
            _anchored_row(
                prepared, spec, report, point, scale, available_windows, timings, estimates.get(_key(point))
            )
            for point in report.points
            if point.role == SIMULATED
        ]
    return rows


def _key(point: SimulatedPoint) -> PointKey:
    return (point.sparsity, point.role)


def _face_at(report: SimulationReport, sparsity: float) -> SimulatedPoint | None:
    return next((p for p in report.points if p.role == SIMULATED and p.sparsity == sparsity), None)


def _row(
    prepared: Prepared,
    spec: SimulateJobCreate,
    report: SimulationReport,
    point: SimulatedPoint,
    available_windows: int,
    timings: dict[str, float],
    found: WindowEstimate | None,
) -> Result:
    measured = _measured(prepared, spec, report, point, found)
    band = _band(point, available_windows) if found is None else _paired_band(found)
    return Result(
        model_id=prepared.source.model_id,
        model_revision=prepared.loaded.revision,
        method=stored_method(spec),
        sparsity=point.sparsity,
        metric="ppl",
        dataset=prepared.data.spec.dataset,
        split=prepared.data.corpus.split,
        value=measured.ppl,
        stderr=None if band is None else band["stderr_log"] * measured.ppl,
        n=measured.tokens_scored,
        source=SIMULATED_SOURCE,
        protocol=_protocol(prepared, spec, report, point, measured, timings) | {"band": band},
    )


def _anchored_row(
    prepared: Prepared,
    spec: SimulateJobCreate,
    report: SimulationReport,
    point: SimulatedPoint,
    scale: AnchoredScale,
    available_windows: int,
    timings: dict[str, float],
    found: WindowEstimate | None,
) -> Result:
    row = _row(prepared, spec, report, point, available_windows, timings, found)
    face = row.value
    value = scale.apply(point.sparsity, face, prepared.dense.value)
    factor = scale.factor(point.sparsity)
    row.value = value
    row.law = ANCHORED_LAW
    row.stderr = None if row.stderr is None else row.stderr / face * value * abs(factor)
    row.protocol = {**row.protocol, "anchored": {**scale.to_dict(), "factor": factor}, "band": None}
    return row


def _protocol(
    prepared: Prepared,
    spec: SimulateJobCreate,
    report: SimulationReport,
    point: SimulatedPoint,
    measured: PerplexityResult,
    timings: dict[str, float],
) -> dict[str, Any]:
    return {
        **perplexity_protocol(
            measured, prepared.data.spec, prepared.data.corpus, prepared.loaded.dtype, spec.seed
        ),
        "method": spec.method,
        "dense_result_id": prepared.dense.id,
        "dense_ppl": prepared.dense.value,
        "dense_reused": prepared.dense_reused,
        "calibration": prepared.calibration_record,
        "simulation": _simulation_record(spec, report, point.role, point.width),
        "timings": timings,
        **prepared.environment,
    }


def _measured(
    prepared: Prepared,
    spec: SimulateJobCreate,
    report: SimulationReport,
    point: SimulatedPoint,
    found: WindowEstimate | None,
) -> PerplexityResult:
    """The point's perplexity as the perplexity protocol records one: its windows' scores, or with a
    precision the paired estimate for every window and the windows it rests on."""
    scores = point.scores
    elapsed = report.timings.get("total", 0.0)
    seqlen = prepared.data.seqlen
    if found is None:
        return PerplexityResult(
            ppl=scores.ppl,
            nll_mean=scores.nll_mean,
            windows=int(scores.nll.numel()),
            tokens_scored=scores.tokens,
            seqlen=seqlen,
            max_windows=spec.perplexity.max_windows,
            elapsed_s=elapsed,
            window_nll=tuple(scores.per_window),
        )
    return PerplexityResult(
        ppl=found.ppl,
        nll_mean=found.nll_mean,
        windows=found.windows,
        tokens_scored=found.windows * (seqlen - 1),
        seqlen=seqlen,
        max_windows=spec.perplexity.max_windows,
        elapsed_s=elapsed,
        window_nll=found.window_nll,
        sampling=found,
    )


def _simulation_record(
    spec: SimulateJobCreate, report: SimulationReport, role: str, width: int | None
) -> dict[str, Any]:
    """How a simulated row was made (its protocol's `simulation`)."""
    return {
        "role": role,
        "engine": report.simulation,
        "bases": report.bases,
        "basis_windows": report.basis_windows if role == SIMULATED else None,
        "basis_dtype": report.basis_dtype if role == SIMULATED else None,
        "window_dtype": report.window_dtype if role == SIMULATED else None,
        "dense_windows": report.dense_windows if role == SIMULATED else None,
        "pilot_on_copy": report.pilot_on_copy if role == SIMULATED else None,
        "width": width,
        # the method's own model up to float rounding (an anchor always is), not an approximation
        "exact": role == ANCHOR
        or (METHODS[spec.method].simulates_exactly(spec.layout) and not report.windows_on_copy),
        "anchors": spec.anchors,
        "family": report.family,
        "calibration_tokens": report.calibration_tokens,
        "engine_timings_s": {key: round(value, 3) for key, value in report.timings.items()},
    }


def _score_tasks(
    context: JobContext,
    prepared: Prepared,
    accuracy: AccuracySpec,
    report: SimulationReport,
    *,
    start: float,
    seed: int,
) -> list[tuple[SimulatedModel, list[ScoredTask]]]:
    """Each simulated sparsity's whole model scored on the job's tasks, one after the other (to the
    accuracy's precision, on docs in the order `seed` draws, paired with the dense ones)."""
    tasks = [plan.name for plan in prepared.accuracy_plans]
    model = prepared.loaded.model
    scored: list[tuple[SimulatedModel, list[ScoredTask]]] = []
    for position, simulated in enumerate(report.models):
        low = stage_progress(start, 1.0, position, len(report.models))
        high = stage_progress(start, 1.0, position + 1, len(report.models))
        prefix = f"s={simulated.sparsity:g} ({position + 1}/{len(report.models)}): "
        with simulated.applied(model):
            found = measure_accuracy(
                context,
                model,
                prepared.loaded.tokenizer,
                accuracy,
                tasks,
                stage="accuracy",
                start=low,
                end=high,
                detail_prefix=prefix,
                dense=prepared.dense_accuracy,
                order_seed=seed,
            )
        scored.append((simulated, found))
    return scored


def simulated_accuracy_results(
    prepared: Prepared,
    spec: SimulateJobCreate,
    report: SimulationReport,
    scored: list[tuple[SimulatedModel, list[ScoredTask]]],
) -> list[Result]:
    """Per simulated sparsity, task and metric: a `simulated` row beside the dense score it compares with."""
    rows = []
    for simulated, tasks in scored:
        width = simulated.width if isinstance(simulated, ProjectedModel) else None
        record = _simulation_record(spec, report, SIMULATED, width)
        rows += compared_accuracy_results(
            prepared,
            spec,
            tasks,
            sparsity=simulated.sparsity,
            extra={"simulation": record},
            source_kind=SIMULATED_SOURCE,
        )
    return rows


def _paired_band(found: WindowEstimate) -> dict[str, Any] | None:
    """The band for the full-window value from paired windows (the dense model's or a reference
    point's, `found.paired_with`); None when every window was scored (the value is the full-window
    one)."""
    if found.complete:
        return None
    return {
        "level": found.level,
        "low": found.low,
        "high": found.high,
        "stderr_log": found.stderr_log,
        "windows": found.windows,
        "of_windows": found.of_windows,
        "estimator": found.estimator,
        "paired_with": found.paired_with,
    }


def _band(point: SimulatedPoint, available_windows: int) -> dict[str, Any] | None:
    """The band for the full split's value from the scored windows (`core.prediction.sampling`); None
    when every window was scored."""
    band = sampled_band(point.scores.per_window, available_windows, BAND_LEVEL)
    return None if band is None else asdict(band)
