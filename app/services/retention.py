"""The retention view of one model (`core.retention`): its pruned task scores and perplexities paired
with the dense results they were measured against, and per pruning the newest probe job's reading."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.schemas.retention import (
    FamilyMeanPublic,
    ProbeReadingPublic,
    PruningRetentionPublic,
    RetainedScorePublic,
    RetentionPublic,
)
from core.methods import DENSE, UNSTRUCTURED, result_method
from core.probe_conventions import DEFAULT_CONVENTION
from core.retention import PruningRetention, retention
from core.tables import Job, JobStatus, ProbePoint, Result

MAX_ROWS = 20_000
"""Newest results read for one model's view: far more than any real set of prunings."""
FINAL_PROBE = ("model", "probs", "kl")  # (probe, space, metric) of the final next-token KL
GREEDY_PROBE = ("generation-greedy", "tokens", "prefix_agree")


def load_retention(session: Session, model: str) -> RetentionPublic:
    """Every pruning of `model` with a paired dense result, oldest method first, by sparsity."""
    pruned = list(
        session.scalars(
            select(Result)
            .where(Result.model_id == model, Result.method != DENSE, Result.source == "measured")
            .order_by(Result.id.desc())
            .limit(MAX_ROWS)
        )
    )
    dense_ids = {row.protocol.get("dense_result_id") for row in pruned}
    dense = list(
        session.scalars(select(Result).where(Result.id.in_([i for i in dense_ids if isinstance(i, int)])))
    )
    prunings = retention(pruned, dense)
    probes = _probe_readings(session, model)
    notes = [
        "retained = pruned / dense for scores, dense / pruned for perplexities: 1 is unchanged, "
        "less is worse",
        "each task counts by its headline metric: acc, or GSM8K's exact_match,flexible-extract",
    ]
    if not prunings:
        notes.append(
            "no pruned result with a paired dense one: submit `prune` or `sweep` jobs with `accuracy` "
            "tasks, multiple choice and generative (lambada_openai, gsm8k)"
        )
    return RetentionPublic(
        model=model,
        prunings=[_public(p, probes.get((p.method, p.sparsity), {})) for p in prunings],
        notes=notes,
    )


def _public(pruning: PruningRetention, probes: dict[str, ProbeReadingPublic]) -> PruningRetentionPublic:
    return PruningRetentionPublic(
        method=pruning.method,
        sparsity=pruning.sparsity,
        verdict=pruning.verdict,
        means=[
            FamilyMeanPublic(family=m.family, retained=m.retained, stderr=m.stderr, tasks=list(m.tasks))
            for m in pruning.means.values()
        ],
        scores=[RetainedScorePublic(**vars(score)) for score in pruning.scores],
        skipped=list(pruning.skipped),
        probe=probes.get(DEFAULT_CONVENTION),
        probes=[probes[name] for name in sorted(probes)],
    )


def _pruning_of(request: dict[str, Any], jobs: dict[str, Job]) -> tuple[str, float] | None:
    """(stored method, sparsity) a probe job measured: its own pruning or its artifact job's."""
    source = request
    if request.get("artifact_job_id"):
        artifact_job = jobs.get(str(request["artifact_job_id"]))
        if artifact_job is None:
            return None
        source = artifact_job.request
    method, sparsity = source.get("method"), source.get("sparsity")
    if not isinstance(method, str) or not isinstance(sparsity, int | float):
        return None
    return result_method(method, str(source.get("pattern", UNSTRUCTURED)), source.get("layout")), float(
        sparsity
    )


def _probe_readings(session: Session, model: str) -> dict[tuple[str, float], dict[str, ProbeReadingPublic]]:
    """(method, sparsity) -> convention -> the newest succeeded probe job's reading."""
    jobs = {
        job.id: job
        for job in session.scalars(
            select(Job).where(Job.model_id == model, Job.status == JobStatus.succeeded)
        )
    }
    readings: dict[tuple[str, float], dict[str, ProbeReadingPublic]] = {}
    probe_jobs = sorted(
        (j for j in jobs.values() if j.kind == "probe"), key=lambda j: j.created_at, reverse=True
    )
    for job in probe_jobs:
        key = _pruning_of(job.request, jobs)
        convention = str(job.request.get("convention") or DEFAULT_CONVENTION)
        if key is None or convention in readings.get(key, {}):
            continue
        points = _points(session, job.id)
        final = [p.value for p in points if (p.probe, p.space, p.metric) == FINAL_PROBE and p.layer is None]
        greedy = sorted(
            (p.step, p.value)
            for p in points
            if (p.probe, p.space, p.metric) == GREEDY_PROBE and p.step is not None
        )
        temperature = job.request.get("temperature")
        readings.setdefault(key, {})[convention] = ProbeReadingPublic(
            job_id=job.id,
            convention=convention,
            temperature=float(temperature) if isinstance(temperature, int | float) else None,
            final_kl=final[0] if final else None,
            greedy_prefix_agree=greedy[-1][1] if greedy else None,
            steps=greedy[-1][0] + 1 if greedy else None,
        )
    return readings


def _points(session: Session, job_id: str) -> Sequence[ProbePoint]:
    wanted = [FINAL_PROBE[0], GREEDY_PROBE[0]]
    return list(
        session.scalars(select(ProbePoint).where(ProbePoint.job_id == job_id, ProbePoint.probe.in_(wanted)))
    )
