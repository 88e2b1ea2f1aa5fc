"""`prune` jobs: prune a model with a method at a sparsity, save it, measure it.

Stages and the share of the job's progress each one covers:

    loading model   0.00-0.05
    dense baseline  0.05-0.25  reused from the store when the same model, data and perplexity
                               protocol were measured before; else measured and stored (dense, 0)
    calibration     0.25-0.30  seeded windows of the calibration corpus (none for magnitude)
    slicing|pruning 0.30-0.75  detail "block i/L" ("slicing" for slicegpt, "pruning" otherwise)
    saving          0.75-0.80  the pruned model under <artifacts dir>/<job id>/, recorded in `artifacts`
                               (`sliced-model`, or a stock transformers checkpoint `pruned-model`)
    perplexity      0.80-1.00  detail "window i/W"

With `accuracy`, the dense baseline span also covers the dense accuracy ("dense accuracy", reused
like the perplexity), pruning to perplexity end at 0.90 and "accuracy" (detail "<task> i/N")
scores the pruned model in 0.90-1.00.

Results: `ppl` of the pruned model (method, requested sparsity; protocol = perplexity protocol +
calibration record + slicing or pruning report + timings + versions) and `param_fraction_removed`
(the real fraction of parameters removed, which differs from the method's sparsity: slicing removes
residual width, intra-layer pruners zero a fraction of the linears' weights only, drops remove
layers), and with `accuracy` `acc` / `acc_norm` per task (dataset = the task) of the dense and the
pruned model. An N:M pattern is part of the stored method name ("wanda-2:4"). The steps are shared
with `sweep` jobs (workers.kinds.prune_steps), and so are the rows (workers.kinds.rows).
"""

from __future__ import annotations

import time

from core.artifacts import job_folder
from core.specs.jobs import PruneJobCreate
from workers.context import JobContext
from workers.kinds.prune_steps import PrepareSpans, lap, prepare, prune_and_measure, score_pruned_accuracy
from workers.kinds.rows import pruned_accuracy_results, pruned_results

SPANS = PrepareSpans(load=0.02, baseline=(0.05, 0.25), calibration=(0.25, 0.30))


def run(context: JobContext) -> None:
    spec = PruneJobCreate.model_validate(context.request)
    started = time.perf_counter()
    prepared = prepare(context, spec, SPANS, spec.accuracy)
    measured_end = 1.0 if spec.accuracy is None else 0.9
    outcome = prune_and_measure(
        context,
        prepared,
        prepared.loaded.model,
        spec,
        spec.sparsity,
        start=SPANS.calibration[1],
        end=measured_end,
        artifact_folder=job_folder(context.settings, context.job_id) if spec.save_artifact else None,
    )
    scored = score_pruned_accuracy(
        context, prepared, spec.accuracy, outcome, start=measured_end, end=1.0, order_seed=spec.seed
    )
    timings = {**prepared.timings, **outcome.timings, "total_s": lap(started)}
    tag = None if context.parent_id is None else {"sweep_job_id": context.parent_id}  # a sweep's child
    context.add_results(
        pruned_results(prepared, spec, outcome, timings=timings, extra_protocol=tag)
        + pruned_accuracy_results(prepared, spec, outcome, scored, extra_protocol=tag)
    )
    context.log.info(
        "prune finished",
        method=spec.method,
        sparsity=spec.sparsity,
        dense_ppl=prepared.dense.value,
        ppl=outcome.perplexity.ppl,
        param_fraction_removed=outcome.report.param_fraction_removed,
        total_s=timings["total_s"],
    )
