"""The store's generation (core.store_generation): every change predictions read bumps it once the
change commits, and nothing else does, on PostgreSQL and SQLite, migrated or built by create_all."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from core.migrate import upgrade
from core.store import Store
from core.tables import Base, Fit, Job, JobStatus, Profile, Result
from tests.conftest import scratch_database

pytestmark = pytest.mark.services


@pytest.fixture(params=["postgres", "sqlite", "sqlite-create-all"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "postgres":
        with scratch_database("prunecast_gen") as url:
            upgrade(url)
            store = Store(url)
            yield store
            store.dispose()
        return
    url = f"sqlite:///{tmp_path / 'store.db'}"
    if request.param == "sqlite":
        upgrade(url)
        store = Store(url)
    else:
        store = Store(url)
        Base.metadata.create_all(store.engine)
    yield store
    store.dispose()


def generation(store: Store) -> int:
    with store.session() as session:
        return int(session.scalar(text("SELECT generation FROM store_generation WHERE id = 1")))


def result(job_id: str, value: float = 30.0) -> Result:
    return Result(job_id=job_id, model_id="m", method="dense", metric="ppl", dataset="wikitext2", value=value)


def test_results_fits_profiles_and_succeeded_jobs_bump_it_and_progress_does_not(store: Store) -> None:
    with store.session() as session:
        session.add(Job(id="job-1", kind="evaluate", request={}, model_id="m", request_hash="h"))
    assert generation(store) == 0  # a queued job changes nothing a prediction reads
    with store.session() as session:
        job = session.get(Job, "job-1")
        assert job is not None
        job.status, job.stage, job.progress = JobStatus.running, "perplexity", 0.5
    assert generation(store) == 0  # nor does its progress
    with store.session() as session:
        session.add_all([result("job-1"), result("job-1", 31.0)])
    assert generation(store) == 2  # one bump per row
    with store.session() as session:
        job = session.get(Job, "job-1")
        assert job is not None
        job.status = JobStatus.succeeded
    assert generation(store) == 3
    seen = generation(store)
    with store.session() as session:
        session.add(
            Fit(
                job_id="job-1", model_id="m", method="slicegpt", metric="ppl", dataset="wikitext2",
                law="alpha", formula="f", params={}, baseline=30.0, points=[], quality={}, chosen_reason="r",
            )
        )  # fmt: skip
        session.add(
            Profile(
                job_id="job-1", model_id="m", family="llama", hidden_size=8, num_layers=1,
                sparsities=[0.1], widths=[8],
            )
        )  # fmt: skip
    assert generation(store) == seen + 2
    with store.session() as session:
        session.execute(text("DELETE FROM results WHERE value = 31.0"))
    assert generation(store) == seen + 3
    with store.session() as session:
        session.execute(text("DELETE FROM jobs WHERE id = 'job-1'"))  # a succeeded job and its rows
    assert generation(store) > seen + 3


def test_a_rolled_back_change_leaves_it_alone(store: Store) -> None:
    with store.session() as session:
        session.add(Job(id="job-1", kind="evaluate", request={}, model_id="m", request_hash="h"))
    with pytest.raises(RuntimeError), store.session() as session:
        session.add(result("job-1"))
        session.flush()
        raise RuntimeError("the job step failed")
    assert generation(store) == 0


def test_a_truncate_bumps_it_on_postgres(store: Store) -> None:
    """TRUNCATE fires no row trigger; a statement trigger covers it (SQLite has no TRUNCATE)."""
    if store.engine.dialect.name != "postgresql":
        pytest.skip("SQLite has no TRUNCATE")
    with store.session() as session:
        session.add(Job(id="job-1", kind="evaluate", request={}, model_id="m", request_hash="h"))
    with store.session() as session:
        session.execute(text("TRUNCATE results CASCADE"))  # and dense_windows, which points at it
    assert generation(store) == 1
    with store.session() as session:
        session.execute(text("TRUNCATE jobs CASCADE"))  # cascades to results, fits and profiles
    assert generation(store) > 1
