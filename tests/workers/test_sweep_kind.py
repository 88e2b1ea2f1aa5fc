"""The `sweep` handler in process (workers.tasks.execute_job on a SQLite store, no queue): every
progress detail it reports, and a retried attempt that resumes instead of measuring again."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, select, update

from core.settings import Settings
from core.specs.jobs import SweepJobCreate
from core.store import Store
from core.tables import Base, Fit, Job, JobStatus, Result
from workers.context import JobContext
from workers.kinds.sweep import sparsity_label
from workers.tasks import execute_job

Report = tuple[str, float, str | None]


@pytest.fixture
def settings(
    worker_settings: Callable[..., Settings], tiny_model_dir: Path, model_cache_dir: Path
) -> Settings:
    return worker_settings(model_roots=[tiny_model_dir.parent], cache_dir=model_cache_dir)


@pytest.fixture
def store(settings: Settings) -> Iterator[Store]:
    settings.home.mkdir(parents=True, exist_ok=True)
    store = Store(settings.store_url)
    Base.metadata.create_all(store.engine)
    yield store
    store.dispose()


@pytest.fixture
def reports(monkeypatch: pytest.MonkeyPatch) -> list[Report]:
    """Every JobContext.report call, including those whose store write is coalesced."""
    seen: list[Report] = []
    original = JobContext.report

    def record(self: JobContext, stage: str, progress: float, detail: str | None = None) -> None:
        seen.append((stage, progress, detail))
        original(self, stage, progress, detail)

    monkeypatch.setattr(JobContext, "report", record)
    return seen


def submit(store: Store, model: Path, sparsities: list[float], **extra: Any) -> str:
    spec = SweepJobCreate.model_validate(
        {
            "kind": "sweep",
            "model": str(model),
            "method": "slicegpt",
            "sparsities": sparsities,
            "calibration": {"num_sequences": 4, "seqlen": 32, "batch_size": 2},
            "perplexity": {"seqlen": 64, "max_windows": 2},
            **extra,
        }
    )
    with store.session() as session:
        job = Job(kind="sweep", request=spec.model_dump(mode="json"), model_id=str(model), request_hash="h")
        session.add(job)
        session.flush()
        return job.id


def job_row(store: Store, job_id: str) -> Job:
    with store.session() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job


def test_sparsity_label_names_the_sparsity_and_its_place() -> None:
    assert sparsity_label(0.2, 2, 4) == "s=0.2 (2/4): "
    assert sparsity_label(0.125, 1, 1) == "s=0.125 (1/1): "


def test_sweep_reports_sparsity_block_and_window_in_every_detail(
    settings: Settings, store: Store, tiny_model_dir: Path, reports: list[Report]
) -> None:
    job_id = submit(store, tiny_model_dir, [0.25, 0.5])
    execute_job(store, settings, job_id)
    assert job_row(store, job_id).status == "succeeded"

    details = [detail for _, _, detail in reports]
    for index, sparsity in enumerate((0.25, 0.5), start=1):
        prefix = f"s={sparsity:g} ({index}/2): "
        expected = [f"{prefix}block {i}/2" for i in range(3)] + [f"{prefix}window {i}/2" for i in (1, 2)]
        assert [d for d in details if d in expected] == expected
    assert "s=0.5 (2/2): fresh dense copy" in details and "s=0.25 (1/2): fresh dense copy" not in details
    stages = [stage for stage, _, _ in reports]
    assert stages[0] == "loading model" and stages[-1] == "fitting"
    progress = [value for _, value, _ in reports]
    assert progress == sorted(progress) and progress[0] > 0.0 and progress[-1] == pytest.approx(0.95)


def test_a_retried_sweep_resumes_from_the_sparsities_it_already_stored(
    settings: Settings, store: Store, tiny_model_dir: Path, reports: list[Report]
) -> None:
    job_id = submit(store, tiny_model_dir, [0.25, 0.5])
    execute_job(store, settings, job_id)
    with store.session() as session:
        first = {(r.sparsity, r.metric): (r.id, r.value) for r in session.scalars(select(Result))}
        # As if the first attempt died after storing s = 0.25, before s = 0.5 and the fit.
        session.execute(delete(Result).where(Result.sparsity == 0.5))
        session.execute(delete(Fit))
        session.execute(update(Job).where(Job.id == job_id).values(status=JobStatus.queued.value))
    reports.clear()

    execute_job(store, settings, job_id)
    job = job_row(store, job_id)
    assert job.status == "succeeded" and job.attempts == 2
    assert "s=0.25 (1/2): measured by an earlier attempt" in [detail for _, _, detail in reports]
    assert not any((detail or "").startswith("s=0.25 (1/2): block") for _, _, detail in reports)
    with store.session() as session:
        second = {(r.sparsity, r.metric): (r.id, r.value) for r in session.scalars(select(Result))}
        fits = session.scalars(select(Fit)).all()
    assert second.keys() == first.keys()
    for key in [(0.0, "ppl"), (0.25, "ppl"), (0.25, "param_fraction_removed")]:
        assert second[key] == first[key]  # kept, not measured again
    assert any((detail or "").startswith("s=0.5 (2/2): block") for _, _, detail in reports)  # measured again
    assert second[(0.5, "ppl")][1] == pytest.approx(first[(0.5, "ppl")][1], rel=1e-6)
    assert len(fits) == 1
    points: list[dict[str, Any]] = fits[0].points
    assert [p["result_id"] for p in points] == [second[(s, "ppl")][0] for s in (0.0, 0.25, 0.5)]


def test_a_retry_after_the_fit_was_stored_measures_nothing_and_stores_no_second_fit(
    settings: Settings, store: Store, tiny_model_dir: Path, reports: list[Report]
) -> None:
    job_id = submit(store, tiny_model_dir, [0.5])
    execute_job(store, settings, job_id)
    with store.session() as session:  # as if the worker died between storing the fit and finishing
        session.execute(update(Job).where(Job.id == job_id).values(status=JobStatus.queued.value))
        results_before = session.scalars(select(Result.id).order_by(Result.id)).all()
    reports.clear()

    execute_job(store, settings, job_id)
    assert job_row(store, job_id).status == "succeeded"
    assert not any("block" in (detail or "") for _, _, detail in reports)
    with store.session() as session:
        assert session.scalars(select(Result.id).order_by(Result.id)).all() == results_before
        assert len(session.scalars(select(Fit)).all()) == 1


def test_a_sparsity_missing_a_requested_metric_is_measured_again_without_duplicating_its_rows(
    settings: Settings, store: Store, tiny_model_dir: Path, reports: list[Report]
) -> None:
    job_id = submit(store, tiny_model_dir, [0.25, 0.5], accuracy={"tasks": ["arc_easy"], "limit": 4})
    execute_job(store, settings, job_id)
    with store.session() as session:
        first = {(r.sparsity, r.metric, r.dataset): r.id for r in session.scalars(select(Result))}
        # As if s = 0.5 had its perplexity but not its accuracy stored, and no fit.
        session.execute(delete(Result).where(Result.sparsity == 0.5, Result.dataset == "arc_easy"))
        session.execute(delete(Fit))
        session.execute(update(Job).where(Job.id == job_id).values(status=JobStatus.queued.value))
    reports.clear()

    execute_job(store, settings, job_id)
    assert job_row(store, job_id).status == "succeeded"
    details = [detail or "" for _, _, detail in reports]
    assert "s=0.25 (1/2): measured by an earlier attempt" in details
    assert any(d.startswith("s=0.5 (2/2): arc_easy") for d in details)
    with store.session() as session:
        second = {(r.sparsity, r.metric, r.dataset): r.id for r in session.scalars(select(Result))}
        count = len(session.scalars(select(Result)).all())
        fits = {(f.metric, f.dataset) for f in session.scalars(select(Fit))}
    assert second.keys() == first.keys() and count == len(second)  # nothing stored twice
    assert second[(0.5, "ppl", "wikitext2")] == first[(0.5, "ppl", "wikitext2")]
    assert ("ppl", "wikitext2") in fits and ("acc", "arc_easy") in fits
