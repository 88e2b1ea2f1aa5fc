"""`sweep` jobs: prune a model at several sparsities, measure each, fit the prediction laws.

Stages and the share of the job's progress each one covers:

    loading model   0.00-0.02
    dense baseline  0.02-0.10  once; reused from the store like a prune job's
    calibration     0.10-0.12  once: every sparsity is sliced with the same windows
    sparsity k/K    0.12-0.95  split evenly over the K pruned sparsities; within each, as in a
                               prune job: slicing (detail "s=0.2 (2/4): block 7/30"), saving
                               (with `save_artifacts`, to <artifacts dir>/<job id>/s<sparsity>/) and
                               perplexity ("s=0.2 (2/4): window 3/4")
    fitting         0.95-1.00  the calibrated PPL laws on the dense + measured points -> `fits`

Each sparsity slices a fresh dense copy: the first one the model loaded for the baseline, the next
ones a copy re-read from the checkpoint (`workers.loading.refresh_model`, cheaper and safer than a
deep copy; numbers there). Each sparsity's results are stored as soon as they are measured, exactly
the rows a `prune` job stores (protocol plus `sweep_job_id`), so a canceled sweep keeps what it
measured (and stores no fit), and a retried attempt resumes: sparsities this job already stored
are not measured again.
"""

from __future__ import annotations

import time

from sqlalchemy import select

from app.fits import FitError, MeasuredPoint, ppl_fit
from app.schemas import SweepJobCreate
from app.tables import Fit, Result
from workers.context import JobContext, JobFailure
from workers.kinds.slicing_steps import (
    Prepared,
    PrepareSpans,
    lap,
    prepare,
    pruned_results,
    slice_and_measure,
)
from workers.kinds.steps import BASELINE_MATCH_KEYS, stage_progress
from workers.loading import refresh_model

SPANS = PrepareSpans(load=0.01, baseline=(0.02, 0.10), calibration=(0.10, 0.12))
POINTS_END = 0.95
# Calibration record keys that identify the windows every point was sliced with.
CALIBRATION_KEYS = ("corpus", "data_sha256", "seed", "num_sequences", "seqlen")


def sparsity_label(sparsity: float, index: int, total: int) -> str:
    """The prefix of a sweep's progress detail, e.g. 's=0.2 (2/4): '."""
    return f"s={sparsity:g} ({index}/{total}): "


def run(context: JobContext) -> None:
    spec = SweepJobCreate.model_validate(context.request)
    prepared = prepare(context, spec, SPANS)
    pruned = spec.pruned_sparsities
    earlier = _measured_earlier(context, spec.method)
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
            refresh_model(prepared.loaded)
            timings["reload_s"] = lap(point_started)
        model_is_dense = False
        outcome = slice_and_measure(
            context,
            prepared,
            prepared.loaded.model,
            spec,
            sparsity,
            start=start,
            end=end,
            artifact_folder=(
                context.settings.artifacts_dir / context.job_id / f"s{sparsity}"  # repr: unique
                if spec.save_artifacts
                else None
            ),
            detail_prefix=prefix,
        )
        timings.update(outcome.timings)
        timings["point_s"] = lap(point_started)
        results = pruned_results(
            prepared, spec, outcome, timings=timings, extra_protocol={"sweep_job_id": context.job_id}
        )
        context.add_results(results)
        earlier[sparsity] = results[0]
        context.log.info(
            "sweep point measured",
            sparsity=sparsity,
            ppl=outcome.perplexity.ppl,
            param_fraction_removed=outcome.report.param_fraction_removed,
            point_s=timings["point_s"],
        )

    context.report("fitting", POINTS_END, "perplexity laws")
    fit = _fit(context, spec, prepared, earlier)
    if _has_fit(context):  # an earlier attempt stored it and died before finishing
        context.log.info("fit stored by an earlier attempt; not stored again")
    else:
        context.add_fits([fit])
    context.log.info(
        "sweep finished",
        dense_ppl=prepared.dense.value,
        ppl={f"{s:g}": earlier[s].value for s in pruned},
        law=fit.law,
        params=fit.params,
        quality={law: {k: q[k] for k in ("r2", "max_ape", "mean_ape")} for law, q in fit.quality.items()},
    )


def _measured_earlier(context: JobContext, method: str) -> dict[float, Result]:
    """Pruned perplexities this job stored in an earlier attempt (a retried sweep resumes)."""
    query = select(Result).where(
        Result.job_id == context.job_id,
        Result.method == method,
        Result.metric == "ppl",
        Result.sparsity > 0.0,
    )
    with context.store.session() as session:
        return {row.sparsity: row for row in session.scalars(query)}


def _has_fit(context: JobContext) -> bool:
    with context.store.session() as session:
        return session.scalar(select(Fit.id).where(Fit.job_id == context.job_id).limit(1)) is not None


def _fit(context: JobContext, spec: SweepJobCreate, prepared: Prepared, measured: dict[float, Result]) -> Fit:
    """The calibrated PPL laws on the dense baseline and every pruned point of this sweep."""
    record = prepared.calibration_record
    slicing = next(iter(measured.values())).protocol["slicing"]
    protocol = {
        **{key: prepared.data.match[key] for key in BASELINE_MATCH_KEYS},
        "calibration": {key: record[key] for key in CALIBRATION_KEYS},
        "round_to": spec.round_to,
        "slice_head": slicing["slice_head"],  # the family default resolved when null was asked
    }
    try:
        return ppl_fit(
            job_id=context.job_id,
            model_id=prepared.source.model_id,
            model_revision=prepared.loaded.revision,
            method=spec.method,
            dataset=prepared.data.spec.dataset,
            protocol=protocol,
            dense=MeasuredPoint(0.0, prepared.dense.value, prepared.dense.id),
            points=[MeasuredPoint(s, row.value, row.id) for s, row in sorted(measured.items())],
        )
    except FitError as error:
        raise JobFailure(
            f"every sparsity was measured and stored, but no law could be fitted: {error}"
        ) from error
