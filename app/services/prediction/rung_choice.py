"""Which rung answers each sparsity of one metric (docs/architecture.md, "Where each rung's answer
comes from, top-down"): the evidence its rungs read (`_evidence`, the profile's predictions among it),
the answer `core.prediction.rungs.best` picks with every rung beside it (`_answer`), and the jobs that
would give a better rung (`_better_rungs`). `app.services.prediction.answer` calls these per metric.
"""

from __future__ import annotations

import structlog
from sqlalchemy.orm import Session

from app.deps import Services
from app.schemas.jobs import JobPublic
from app.schemas.predictions import (
    EstimatePublic,
    MetricPredictionPublic,
    MissingJobPublic,
    PredictionCreate,
)
from app.schemas.records import verdict_public
from app.services.prediction import missing_jobs
from app.services.prediction.profile_rung import BeforePruning, before_pruning_public, cached_before_pruning
from app.services.prediction.rungs import Evidence, estimates
from app.services.prediction.scored_curves import scored_curves
from app.services.prediction.series import PPL, Series, finite
from app.services.prediction.simulated import ProtocolKey, newest_simulation, simulation_records
from app.services.prediction.simulated_scores import newest_simulated_scores
from app.services.prediction.store_state import StoreState
from core.model_sources import ModelSourceError, resolve_model
from core.prediction.laws import Calibration
from core.prediction.rungs import Estimate, best
from core.profiles import METHOD_FEATURES

log = structlog.get_logger(__name__)


def _evidence(
    services: Services,
    state: StoreState,
    series: Series,
    body: PredictionCreate,
    calibration: Calibration | None,
    model_ids: list[str],
) -> Evidence:
    """What the rungs of one metric read (`app.services.prediction.rungs.Evidence`): accuracy has the
    measured, simulated (task scores compared with the series' stored dense score) and law rungs."""
    if series.metric != PPL:
        dense_id = None if series.dense is None else series.dense.result_id
        if series.task is None or dense_id is None:
            return Evidence(series, body.level, calibration)
        with services.store.session() as session:  # it reads only where a cache misses
            task_scores = newest_simulated_scores(
                session, series.model, series.method, series.task, series.metric, dense_id, state
            )
        return Evidence(series, body.level, calibration, simulated_scores=task_scores)
    assert series.dense is not None
    if series.source == "store":
        protocol: ProtocolKey = (series.seqlen, series.max_windows, series.dtype)
    else:
        protocol = (body.protocol.seqlen, body.protocol.max_windows, body.protocol.dtype)
    method, level = series.method, body.level
    with services.store.session() as session:  # it reads only where a cache misses
        scored = scored_curves(session, method, level, state)
        records = simulation_records(session, method, level, state)
        simulation = newest_simulation(
            session,
            series.model,
            method,
            series.dataset,
            protocol,
            any_unset=series.source != "store",
            state=state,
        )
        before = None
        if method in METHOD_FEATURES:
            before = _before_pruning(session, state, model_ids, body, series)
    scores = {(score.predictor, score.mode): score for score in scored.scores}
    return Evidence(series, level, calibration, scored.curves, scores, simulation, records, before)


def _before_pruning(
    session: Session, state: StoreState, model_ids: list[str], body: PredictionCreate, series: Series
) -> BeforePruning | None:
    """The profile-based predictions (`app.services.prediction.profile_rung`), when the model has a
    stored profile, updated with the series' own pruned points. A profile the laws cannot use (say, a dense
    perplexity they refuse) leaves the rest of the answer standing: logged, and the rung says so."""
    assert series.dense is not None
    try:
        return cached_before_pruning(
            session,
            state,
            sorted(set(model_ids)),
            body.method,
            series.dense.value,
            body.sparsities,
            body.level,
            None if body.calibration is None else body.calibration.model_dump(),
            [p.as_tuple for p in series.pruned],
        )
    except ValueError as error:
        log.warning("no prediction from the profile", model=body.model, reason=str(error))
        return None


def _answer(item: MetricPredictionPublic, evidence: Evidence, body: PredictionCreate) -> None:
    """Each prediction's answer from its rungs (`core.prediction.rungs.best`), the rest beside it."""
    if evidence.before is not None:
        item.before_pruning = before_pruning_public(evidence.before)
    for predicted in item.predictions:
        found = estimates(evidence, predicted.sparsity)
        chosen = best(found, body.rung)
        predicted.alternatives = [_estimate_public(e) for e in found]
        if chosen is None:
            predicted.value, predicted.band, predicted.rung, predicted.predictor = None, None, None, None
            predicted.flags.append("no_answer")
            wanted = "no rung" if body.rung == "best" else f"the {body.rung} rung"
            predicted.notes.append(f"{wanted} can answer here: see `alternatives` for why each cannot")
        else:
            predicted.value, predicted.rung, predicted.predictor = (
                finite(chosen.value),
                str(chosen.rung),
                chosen.predictor,
            )
            predicted.band = None if chosen.band is None else [finite(b) for b in chosen.band]
            predicted.verdict = verdict_public(chosen.verdict)
            predicted.flags.extend(f for f in chosen.flags if f not in predicted.flags)
        if predicted.strict is not None and predicted.value:
            predicted.strict_vs_value = finite(predicted.strict / predicted.value - 1.0)
        else:
            predicted.strict_vs_value = None


def _estimate_public(estimate: Estimate) -> EstimatePublic:
    return EstimatePublic(
        rung=str(estimate.rung),
        value=None if estimate.value is None else finite(estimate.value),
        band=None if estimate.band is None else [finite(b) for b in estimate.band],
        predictor=estimate.predictor,
        source=estimate.source,
        verdict=verdict_public(estimate.verdict),
        why_not=estimate.why_not,
        flags=list(estimate.flags),
    )


def _better_rungs(
    services: Services,
    item: MetricPredictionPublic,
    evidence: Evidence,
    body: PredictionCreate,
    model_ids: set[str],
) -> None:
    """Name the jobs that would give a better rung (`missing`), and queue them with `measure_missing`;
    none when every asked sparsity is measured already."""
    if all(p.rung == "measured" for p in item.predictions):
        return
    jobs, why = missing_jobs.better_rungs(
        body, evidence.series, simulated=evidence.simulation is not None, profiled=evidence.before is not None
    )
    item.notes.extend(why)
    item.missing = [MissingJobPublic(kind=j.kind, gives=j.gives, job=j.body) for j in jobs]
    if not body.measure_missing or not jobs:
        return
    active = missing_jobs.active_jobs(services, _with_canonical(services, model_ids), ("simulate", "profile"))
    for job in jobs:
        row, reused = missing_jobs.queue(services, job.body, active)
        item.queued.append(JobPublic.model_validate(row))
        log.info(
            "prediction queued a better rung", model=body.model, job_id=row.id, kind=job.kind, reused=reused
        )


def _with_canonical(services: Services, model_ids: set[str]) -> set[str]:
    ids = set(model_ids)
    for model in model_ids:
        try:
            ids.add(resolve_model(model, services.settings).model_id)
        except ModelSourceError:
            continue
    return ids
