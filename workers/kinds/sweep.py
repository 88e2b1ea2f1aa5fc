"""`sweep` jobs: prune a model at several sparsities, measure each, fit the prediction laws.

Every method sweeps: the stage of each point is the method's ("slicing" or "pruning"); the fits of
methods other than slicing are empirical curves (`core.prediction.fits.ppl_fit` with `strict_law=False`).

Stages and the share of the job's progress each one covers:

    loading model   0.00-0.02
    dense baseline  0.02-0.10  once; reused from the store like a prune job's
    calibration     0.10-0.12  once: every sparsity is sliced with the same windows
    sparsity k/K    0.12-0.95  split evenly over the K pruned sparsities; within each, as in a
                               prune job: slicing (detail "s=0.2 (2/4): block 7/30"), saving
                               (with `save_artifacts`, to <artifacts dir>/<job id>/s<sparsity>/) and
                               perplexity ("s=0.2 (2/4): window 3/4")
    fitting         0.95-1.00  the calibrated PPL laws on the dense + measured points -> `fits`

With `accuracy`, the dense baseline span also covers the dense accuracy (measured or reused once),
each sparsity's last fifth scores the sliced model ("accuracy", detail "s=0.2 (2/4): arc_easy 1/2")
and fitting also stores one calibrated accuracy law per multiple-choice task and metric (`acc`,
`acc_norm`; the generative tasks' scores are stored, not fitted: the laws need a chance floor); a
task and metric whose law cannot be fitted is logged and left out, the other fits are still stored.

Each sparsity slices a fresh dense copy: the first one the model loaded for the baseline, the next
ones a copy re-read from the checkpoint (`workers.loading.refresh_model`, cheaper and safer than a
deep copy; numbers there). Each sparsity's results are stored as soon as they are measured, exactly
the rows a `prune` job stores (protocol plus `sweep_job_id`), so a canceled sweep keeps what it
measured (and stores no fit), and a retried attempt resumes: sparsities for which this job already
stored every requested metric are not measured again (a sparsity's rows are stored in one go).

Fanned out (`fan_out` true, or null with more than one worker on the queue:
`sweep_fanout.fans_out`), the sparsities are measured by child prune jobs that any worker may take
(`workers.kinds.sweep_fanout`); the dense baseline and the fitting stay here.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import select

from core.artifacts import job_folder
from core.methods import METHODS
from core.prediction.fits import FitError, MeasuredPoint, accuracy_fit, n_options_from, ppl_fit
from core.profiles import CALIBRATION_KEYS
from core.specs.jobs import SweepJobCreate
from core.tables import Fit, Result
from core.tasks import task_info
from workers.context import JobContext, JobFailure
from workers.kinds.prune_steps import (
    Prepared,
    PrepareSpans,
    lap,
    prepare,
    prune_and_measure,
    score_pruned_accuracy,
)
from workers.kinds.rows import NO_DATASET, pruned_accuracy_results, pruned_results, stored_method
from workers.kinds.steps import BASELINE_MATCH_KEYS, stage_progress
from workers.kinds.sweep_fanout import RowKey, fans_out, measure_through_children
from workers.loading import ModelLoadError, refresh_model

SPANS = PrepareSpans(load=0.01, baseline=(0.02, 0.10), calibration=(0.10, 0.12))
POINTS_END = 0.95
# Share of one sparsity's progress span that perplexity ends at when accuracy follows.
ACCURACY_FROM = 0.8


def sparsity_label(sparsity: float, index: int, total: int) -> str:
    """The prefix of a sweep's progress detail, e.g. 's=0.2 (2/4): '."""
    return f"s={sparsity:g} ({index}/{total}): "


def run(context: JobContext) -> None:
    spec = SweepJobCreate.model_validate(context.request)
    prepared = prepare(context, spec, SPANS, spec.accuracy)
    fan_out, why = fans_out(context, spec)
    context.log.info("sweep fans out" if fan_out else "sweep measures in turn", why=why)
    if fan_out:
        earlier = measure_through_children(
            context, spec, prepared, start=SPANS.calibration[1], end=POINTS_END
        )
    else:
        earlier = _measure_in_turn(context, spec, prepared)
    _fit_and_store(context, spec, prepared, earlier)


def _measure_in_turn(
    context: JobContext, spec: SweepJobCreate, prepared: Prepared
) -> dict[float, dict[RowKey, Result]]:
    """Every pruned sparsity measured here, one after another, on fresh dense copies; the stored
    rows per sparsity (those an earlier attempt stored are not measured again)."""
    pruned = spec.pruned_sparsities
    required = _required_rows(prepared)
    stored = _stored_earlier(context, stored_method(spec))
    earlier = {s: rows for s, rows in stored.items() if required <= rows.keys()}
    if earlier:
        context.log.info("resuming sweep", measured=sorted(earlier))

    model_is_dense = True  # prepared.loaded.model has not been sliced yet
    for index, sparsity in enumerate(pruned, start=1):
        start = stage_progress(SPANS.calibration[1], POINTS_END, index - 1, len(pruned))
        end = stage_progress(SPANS.calibration[1], POINTS_END, index, len(pruned))
        prefix = sparsity_label(sparsity, index, len(pruned))
        if sparsity in earlier:
            context.report("slicing", end, f"{prefix}measured by an earlier attempt")
            continue
        point_started = time.perf_counter()
        timings = dict(prepared.timings)
        if not model_is_dense:
            context.report("slicing", start, f"{prefix}fresh dense copy")  # a safe point to stop
            try:
                refresh_model(prepared.loaded)
            except ModelLoadError as error:  # e.g. the copy's memory plan: too large for the device
                raise JobFailure(f"{prefix}{error}") from error
            timings["reload_s"] = lap(point_started)
        model_is_dense = False
        measured_end = end if spec.accuracy is None else start + ACCURACY_FROM * (end - start)
        outcome = prune_and_measure(
            context,
            prepared,
            prepared.loaded.model,
            spec,
            sparsity,
            start=start,
            end=measured_end,
            artifact_folder=(
                job_folder(context.settings, context.job_id) / f"s{sparsity}"  # repr: unique
                if spec.save_artifacts
                else None
            ),
            detail_prefix=prefix,
        )
        scored = score_pruned_accuracy(
            context,
            prepared,
            spec.accuracy,
            outcome,
            start=measured_end,
            end=end,
            detail_prefix=prefix,
            order_seed=spec.seed,
        )
        timings.update(outcome.timings)
        timings["point_s"] = lap(point_started)
        tag = {"sweep_job_id": context.job_id}
        results = pruned_results(prepared, spec, outcome, timings=timings, extra_protocol=tag)
        results += pruned_accuracy_results(prepared, spec, outcome, scored, extra_protocol=tag)
        # Rows an earlier attempt stored for this sparsity are kept, not stored twice.
        already = stored.get(sparsity, {})
        new = [row for row in results if (row.metric, row.dataset) not in already]
        context.add_results(new)  # one transaction: a sparsity is stored whole or not at all
        earlier[sparsity] = {**already, **{(row.metric, row.dataset): row for row in new}}
        context.log.info(
            "sweep point measured",
            sparsity=sparsity,
            ppl=outcome.perplexity.ppl,
            accuracy={f"{r.task}/{m}": v for r in scored for m, (v, _) in r.metric_values().items()},
            param_fraction_removed=outcome.report.param_fraction_removed,
            point_s=timings["point_s"],
        )
    return earlier


def _fit_and_store(
    context: JobContext, spec: SweepJobCreate, prepared: Prepared, earlier: dict[float, dict[RowKey, Result]]
) -> None:
    """The laws on the dense baseline and every sparsity's rows, stored once."""
    pruned = spec.pruned_sparsities
    context.report(
        "fitting", POINTS_END, "perplexity laws" if spec.accuracy is None else "perplexity and accuracy laws"
    )
    ppl_key = ("ppl", prepared.data.spec.dataset)
    fit = _fit(context, spec, prepared, {s: rows[ppl_key] for s, rows in earlier.items()})
    fits = [fit, *_accuracy_fits(context, spec, prepared, earlier)]
    if _has_fit(context):  # an earlier attempt stored them and died before finishing
        context.log.info("fits stored by an earlier attempt; not stored again")
    else:
        context.add_fits(fits)  # one transaction: all of them or none
    context.log.info(
        "sweep finished",
        dense_ppl=prepared.dense.value,
        ppl={f"{s:g}": earlier[s][ppl_key].value for s in pruned},
        law=fit.law,
        params=fit.params,
        quality={law: {k: q[k] for k in ("r2", "max_ape", "mean_ape")} for law, q in fit.quality.items()},
        accuracy_laws={f"{f.dataset}/{f.metric}": f.law for f in fits[1:]},
    )


def _required_rows(prepared: Prepared) -> set[RowKey]:
    """The rows a sparsity of this sweep stores: ppl, param_fraction_removed, each task's metrics."""
    return {
        ("ppl", prepared.data.spec.dataset),
        ("param_fraction_removed", NO_DATASET),
        *((metric, plan.name) for plan in prepared.accuracy_plans for metric in plan.metrics),
    }


def _stored_earlier(context: JobContext, method: str) -> dict[float, dict[RowKey, Result]]:
    """Pruned results this job stored in an earlier attempt, per sparsity (a retried sweep resumes
    from the sparsities that have every row it needs)."""
    query = select(Result).where(
        Result.job_id == context.job_id,
        Result.method == method,
        Result.sparsity > 0.0,
    )
    found: dict[float, dict[RowKey, Result]] = {}
    for row in context.read(lambda session: session.scalars(query).all(), "reading earlier attempts' points"):
        found.setdefault(row.sparsity, {})[(row.metric, row.dataset)] = row
    return found


def _has_fit(context: JobContext) -> bool:
    query = select(Fit.id).where(Fit.job_id == context.job_id).limit(1)
    return context.read(lambda session: session.scalar(query), "looking for stored fits") is not None


def _pruning_protocol(spec: SweepJobCreate, prepared: Prepared, ppl_row: Result) -> dict[str, Any]:
    """What every fit of this sweep shares: the calibration windows (none for `magnitude`) and, for
    slicing, how the model was sliced."""
    record = prepared.calibration_record
    protocol: dict[str, Any] = {
        "calibration": None if record is None else {key: record[key] for key in CALIBRATION_KEYS}
    }
    if "slicing" in ppl_row.protocol:
        protocol["round_to"] = spec.round_to
        protocol["slice_head"] = ppl_row.protocol["slicing"]["slice_head"]  # the family default resolved
    return protocol


def _fit(context: JobContext, spec: SweepJobCreate, prepared: Prepared, measured: dict[float, Result]) -> Fit:
    """The calibrated PPL laws on the dense baseline and every pruned point of this sweep."""
    protocol = {
        **{key: prepared.data.match[key] for key in BASELINE_MATCH_KEYS},
        **_pruning_protocol(spec, prepared, next(iter(measured.values()))),
    }
    try:
        return ppl_fit(
            job_id=context.job_id,
            model_id=prepared.source.model_id,
            model_revision=prepared.loaded.revision,
            method=stored_method(spec),
            dataset=prepared.data.spec.dataset,
            protocol=protocol,
            dense=MeasuredPoint(0.0, prepared.dense.value, prepared.dense.id),
            points=[MeasuredPoint(s, row.value, row.id) for s, row in sorted(measured.items())],
            strict_law=METHODS[spec.method].strict_law_applies,
        )
    except FitError as error:
        raise JobFailure(
            f"every sparsity was measured and stored, but no law could be fitted: {error}"
        ) from error


def _accuracy_fits(
    context: JobContext, spec: SweepJobCreate, prepared: Prepared, measured: dict[float, dict[RowKey, Result]]
) -> list[Fit]:
    """The calibrated accuracy laws per task and metric on the dense accuracy and every pruned
    point; a task and metric the laws cannot fit is logged and left out, the others are kept."""
    fits: list[Fit] = []
    ppl_key = ("ppl", prepared.data.spec.dataset)
    shared = _pruning_protocol(spec, prepared, next(iter(measured.values()))[ppl_key])
    for plan in prepared.accuracy_plans:
        if task_info(plan.name).generative:  # the laws need a chance floor among options
            continue
        for metric in plan.metrics:
            dense = prepared.dense_accuracy[plan.name].results[metric]
            try:
                fits.append(
                    accuracy_fit(
                        job_id=context.job_id,
                        model_id=prepared.source.model_id,
                        model_revision=prepared.loaded.revision,
                        method=stored_method(spec),
                        metric=metric,
                        task=plan.name,
                        n_options=n_options_from(dense.protocol),
                        protocol={**plan.match, "chance": dense.protocol.get("chance"), **shared},
                        dense=MeasuredPoint(0.0, dense.value, dense.id),
                        points=[
                            MeasuredPoint(s, rows[(metric, plan.name)].value, rows[(metric, plan.name)].id)
                            for s, rows in sorted(measured.items())
                        ],
                    )
                )
            except FitError as error:
                context.log.warning(
                    "no accuracy law fitted", task=plan.name, metric=metric, reason=str(error)
                )
    return fits
