"""Steps several job kinds share: load the model, score perplexity, find or measure the dense baseline.

Every kind records perplexity under the same protocol keys (`rows.perplexity_protocol`), so a dense
number measured by an `evaluate` job is found and reused by a later `prune` or `sweep` job, and
numbers from different kinds compare. The rows these steps store are built in `workers.kinds.rows`;
the steps of the pruning kinds are in `prune_steps`, those that score tasks in `accuracy_steps`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.methods import DENSE
from core.model_sources import ModelSource, ModelSourceError, resolve_model
from core.prediction.paired_windows import WindowEstimate
from core.specs.common import ModelSpec, PerplexitySpec
from core.tables import Job, JobStatus, Result
from workers.context import JobContext, JobFailure
from workers.data import DataMissingError, load_wikitext2_test, tokenize_corpus
from workers.evaluation.perplexity import EvaluationStopped, PerplexityResult, effective_seqlen, perplexity
from workers.evaluation.sampled_perplexity import perplexity_to_precision
from workers.kinds.job_data import PerplexityData
from workers.kinds.rows import dense_perplexity_result, dtype_name
from workers.loading import LoadedModel, ModelLoadError, load_model

# Protocol keys that must be equal for two perplexities of one model to be the same measurement.
BASELINE_MATCH_KEYS = ("seqlen", "max_windows", "data_sha256", "dtype")


def stage_progress(start: float, end: float, done: int, total: int) -> float:
    """Map `done` of `total` steps of a stage onto the job's progress range [start, end]."""
    fraction = min(max(done / total, 0.0), 1.0) if total > 0 else 1.0
    return start + (end - start) * fraction


def step_reporter(
    context: JobContext, stage: str, start: float, end: float, unit: str, prefix: str = ""
) -> Callable[[int, int], None]:
    """A `progress(done, total)` callback reporting `stage` with detail like 'block 3/30'
    (after `prefix`, e.g. 's=0.2 (2/4): block 3/30' in a sweep)."""

    def report(done: int, total: int) -> None:
        context.report(stage, stage_progress(start, end, done, total), f"{prefix}{unit} {done}/{total}")

    return report


def band_reporter(
    context: JobContext, stage: str, start: float, end: float, prefix: str = ""
) -> Callable[[WindowEstimate], None]:
    """A progress callback for windows scored to a precision: 'window i of at most W, band ±x %'."""

    def report(found: WindowEstimate) -> None:
        context.report(
            stage,
            stage_progress(start, end, found.windows, found.of_windows),
            f"{prefix}{band_detail(found)}",
        )

    return report


def band_detail(found: WindowEstimate) -> str:
    return (
        f"window {found.windows} of at most {found.of_windows}, band ±{100 * found.relative_half_width:.1f} %"
    )


def load_for_job(context: JobContext, spec: ModelSpec) -> tuple[ModelSource, LoadedModel]:
    """Resolve and load the job's model; user-facing problems become JobFailure."""
    try:
        source = resolve_model(spec.model, context.settings, spec.revision)
        loaded = load_model(
            source, context.settings, dtype=spec.dtype, device=spec.device, offload=spec.offload
        )
    except (ModelSourceError, ModelLoadError) as error:
        raise JobFailure(str(error)) from error
    return source, loaded


def measure_perplexity(
    context: JobContext,
    model: torch.nn.Module,
    token_ids: torch.Tensor,
    spec: PerplexitySpec,
    seqlen: int,
    *,
    stage: str,
    start: float,
    end: float,
    detail_prefix: str = "",
    precision: float | None = None,
    order_seed: int = 0,
    dense_window_nll: Sequence[float] | None = None,
) -> PerplexityResult:
    """Score `model` on `token_ids`, reporting 'window i/W' within [start, end] of the job; with
    `precision`, only as many windows (in the seeded order, paired with `dense_window_nll` when given)
    as reach it, reporting 'window i of at most W, band ±x %'. A non-finite perplexity (a diverged
    model) fails the job: it could be neither stored nor fitted."""
    try:
        if precision is None:
            measured = perplexity(
                model,
                token_ids,
                seqlen=seqlen,
                max_windows=spec.max_windows,
                batch_size=spec.batch_size,
                progress=step_reporter(context, stage, start, end, "window", detail_prefix),
                should_stop=context.should_stop,
            )
        else:
            measured = perplexity_to_precision(
                model,
                token_ids,
                seqlen=seqlen,
                precision=precision,
                order_seed=order_seed,
                dense_window_nll=dense_window_nll,
                max_windows=spec.max_windows,
                batch_size=spec.batch_size,
                progress=band_reporter(context, stage, start, end, detail_prefix),
                should_stop=context.should_stop,
            )
    except EvaluationStopped:
        context.check_stop()
        raise
    except ValueError as error:
        raise JobFailure(f"perplexity: {error}") from error
    if not math.isfinite(measured.ppl):
        raise JobFailure(
            f"perplexity is not finite ({measured.ppl}; mean NLL {measured.nll_mean}): the model's outputs "
            "overflowed or are NaN; measure in float32, or prune less"
        )
    return measured


def find_dense_baseline(
    session: Session,
    model_id: str,
    revision: str | None,
    dataset: str,
    protocol: dict[str, Any],
    *,
    metric: str = "ppl",
    match_keys: tuple[str, ...] = BASELINE_MATCH_KEYS,
    own_job_id: str | None = None,
    parent_job_id: str | None = None,
    need_window_nll: bool = False,
) -> Result | None:
    """The newest measured dense `metric` of this model (and revision) on `dataset` whose protocol
    equals `protocol` on every `match_keys` key, or None. Perplexity matches on BASELINE_MATCH_KEYS;
    accuracy (dataset = the task) on `accuracy_steps.ACCURACY_MATCH_KEYS`.

    Only a finished measurement is reused: a row of a succeeded job (or of no job), or of the asking
    job itself (`own_job_id`, a resumed attempt), or of its parent (`parent_job_id`: a fanned-out
    sweep's children share its fate, since canceling the sweep cancels them, and a sweep resumes
    rather than deleting what it stored). A running job's rows may still vanish (canceled, retried),
    and nothing else may point at them (core.lifecycle). A row scored on part of the windows is never a
    baseline; with `need_window_nll`, only a row with its per-window NLL is (a job pairing with it)."""
    wanted = {key: protocol[key] for key in match_keys}
    finished = Result.job_id.is_(None) | Result.job_id.in_(
        select(Job.id).where(Job.status == JobStatus.succeeded)
    )
    for job_id in (own_job_id, parent_job_id):
        if job_id is not None:
            finished = finished | (Result.job_id == job_id)
    query = (
        select(Result)
        .where(
            Result.model_id == model_id,
            Result.method == DENSE,
            Result.metric == metric,
            Result.dataset == dataset,
            Result.source == "measured",
            Result.model_revision.is_(None) if revision is None else Result.model_revision == revision,
            finished,
        )
        .order_by(Result.id.desc())
    )
    for row in session.scalars(query):
        if row.protocol.get("sampling") is not None:  # part of the windows: an estimate, not a baseline
            continue
        if need_window_nll and not row.protocol.get("window_nll"):
            continue  # measured before per-window NLL was kept: cannot pair
        if all(row.protocol.get(key) == value for key, value in wanted.items()):
            return row
    return None


def perplexity_data(context: JobContext, loaded: LoadedModel, spec: PerplexitySpec) -> PerplexityData:
    """Load and tokenise the evaluation split (cached) for `loaded`'s tokenizer."""
    try:
        corpus = load_wikitext2_test(context.settings)
    except DataMissingError as error:
        raise JobFailure(str(error)) from error
    token_ids = tokenize_corpus(loaded.tokenizer, corpus, settings=context.settings)
    seqlen = effective_seqlen(loaded.model, spec.seqlen)
    match = {
        "seqlen": seqlen,
        "max_windows": spec.max_windows,
        "data_sha256": corpus.sha256,
        "dtype": dtype_name(loaded.dtype),
    }
    assert tuple(match) == BASELINE_MATCH_KEYS
    return PerplexityData(spec=spec, corpus=corpus, token_ids=token_ids, seqlen=seqlen, match=match)


def dense_baseline(
    context: JobContext,
    source: ModelSource,
    loaded: LoadedModel,
    data: PerplexityData,
    environment: dict[str, Any],
    seed: int,
    *,
    start: float,
    end: float,
) -> tuple[Result, bool]:
    """The dense perplexity under `data`'s protocol: reused from the store when this model was
    measured so before, else measured on `loaded.model` (unchanged) on every window and stored as a
    (dense, 0) result of this job with its per-window NLL (what a job with a `precision` pairs with).
    Returns the result and whether it came from another job."""
    dense = context.read(
        lambda session: find_dense_baseline(
            session,
            source.model_id,
            loaded.revision,
            data.spec.dataset,
            data.match,
            own_job_id=context.job_id,
            parent_job_id=context.parent_id,
            need_window_nll=data.spec.precision is not None,
        ),
        "looking for a dense baseline to reuse",
    )
    if dense is not None:
        context.report("dense baseline", end, f"reused result {dense.id}")
        return dense, dense.job_id != context.job_id
    measured = measure_perplexity(
        context,
        loaded.model,
        data.token_ids,
        data.spec,
        data.seqlen,
        stage="dense baseline",
        start=start,
        end=end,
    )
    dense = dense_perplexity_result(
        measured,
        source=source,
        loaded=loaded,
        spec=data.spec,
        corpus=data.corpus,
        seed=seed,
        environment=environment,
    )
    context.add_results([dense])
    return dense, False
