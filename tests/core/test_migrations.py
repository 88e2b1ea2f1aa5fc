"""Migrations build the same schema as the ORM tables, on Postgres and SQLite, and go both ways."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, select, text

from core.migrate import alembic_config, pending_migrations, upgrade
from core.store import Store, make_engine
from core.tables import Base, Fit, Job, ProbePoint, Profile
from tests.conftest import scratch_database


def _schema(url: str) -> dict[str, set[str]]:
    engine = make_engine(url)
    inspector = inspect(engine)
    tables = {
        name: {column["name"] for column in inspector.get_columns(name)}
        for name in inspector.get_table_names()
    }
    engine.dispose()
    tables.pop("alembic_version", None)
    return tables


EXPECTED = {table.name: {column.name for column in table.columns} for table in Base.metadata.sorted_tables}
# Revision 0011 added dense_windows, 0010 store_generation, 0009 probe_points.convention, 0008
# profile_linears, 0007 jobs.parent_id, 0006 the probe points' spread, 0005 the profile tables, 0004
# jobs.progress_at, 0003 probe_points.probe.
BEFORE_0011 = {name: columns for name, columns in EXPECTED.items() if name != "dense_windows"}
BEFORE_0010 = {name: columns for name, columns in BEFORE_0011.items() if name != "store_generation"}
BEFORE_0009 = {**BEFORE_0010, "probe_points": EXPECTED["probe_points"] - {"convention"}}
BEFORE_0008 = {name: columns for name, columns in BEFORE_0009.items() if name != "profile_linears"}
BEFORE_0007 = {**BEFORE_0008, "jobs": EXPECTED["jobs"] - {"parent_id"}}
SPREAD = {"n", "stderr", "value_min", "value_max"}
BEFORE_0006 = {**BEFORE_0007, "probe_points": BEFORE_0009["probe_points"] - SPREAD}
BEFORE_0005 = {
    name: columns for name, columns in BEFORE_0006.items() if name not in ("profiles", "profile_signals")
}
BEFORE_0004 = {**BEFORE_0005, "jobs": BEFORE_0007["jobs"] - {"progress_at"}}
BEFORE_0003 = {**BEFORE_0004, "probe_points": BEFORE_0004["probe_points"] - {"probe"}}


def _insert_job(store: Store, job_id: str, kind: str, status: str = "queued") -> None:
    """A job row as an older revision's code wrote it (the ORM's table has newer columns)."""
    with store.session() as session:
        session.execute(
            text(
                "INSERT INTO jobs (id, kind, status, request, model_id, created_at, updated_at, stage, "
                "progress, attempts, cancel_requested, request_hash) VALUES (:id, :kind, :status, '{}', "
                "'m', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, 'queued', 0, 0, false, 'h')"
            ),
            {"id": job_id, "kind": kind, "status": status},
        )


@pytest.fixture
def scratch_pg_url() -> Iterator[str]:
    with scratch_database("prunecast_mig") as url:
        yield url


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_upgrade_matches_tables_and_downgrade_removes_them(
    backend: str, scratch_pg_url: str, tmp_path: Path
) -> None:
    url = scratch_pg_url if backend == "postgres" else f"sqlite:///{tmp_path / 'store.db'}"
    engine = make_engine(url)
    assert pending_migrations(engine)
    upgrade(url)
    assert not pending_migrations(engine)
    engine.dispose()
    assert _schema(url) == EXPECTED
    command.downgrade(alembic_config(url), "base")
    assert _schema(url) == {}


def _url(backend: str, scratch_pg_url: str, tmp_path: Path) -> str:
    return scratch_pg_url if backend == "postgres" else f"sqlite:///{tmp_path / 'store.db'}"


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_migrated_schema_matches_the_tables_in_types_indexes_and_keys(
    backend: str, scratch_pg_url: str, tmp_path: Path
) -> None:
    url = _url(backend, scratch_pg_url, tmp_path)
    upgrade(url)
    engine = make_engine(url)
    with engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    engine.dispose()
    assert diff == []


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_fits_migration_upgrades_a_0001_store_with_data_and_downgrades_back(
    backend: str, scratch_pg_url: str, tmp_path: Path
) -> None:
    url = _url(backend, scratch_pg_url, tmp_path)
    upgrade(url, "0001")
    store = Store(url)
    _insert_job(store, "job-1", "sweep")
    upgrade(url)
    assert _schema(url) == EXPECTED
    with store.session() as session:
        session.add(
            Fit(
                job_id="job-1",
                model_id="m",
                method="slicegpt",
                metric="ppl",
                dataset="wikitext2",
                law="alpha",
                formula="f",
                params={"alpha": 1.2},
                baseline=20.0,
                points=[{"sparsity": 0.0, "value": 20.0, "result_id": None, "used": True}],
                quality={},
                chosen_reason="r",
            )
        )
    with store.session() as session:
        assert session.scalars(select(Fit.params)).one() == {"alpha": 1.2}
    store.dispose()

    command.downgrade(alembic_config(url), "0001")
    assert _schema(url) == {name: columns for name, columns in BEFORE_0003.items() if name != "fits"}
    store = Store(url)
    with store.session() as session:
        assert session.scalars(select(Job.id)).all() == ["job-1"]
    store.dispose()


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_probe_kind_migration_upgrades_a_0002_store_with_points_and_downgrades_back(
    backend: str, scratch_pg_url: str, tmp_path: Path
) -> None:
    url = _url(backend, scratch_pg_url, tmp_path)
    upgrade(url, "0002")
    assert _schema(url) == BEFORE_0003
    store = Store(url)
    _insert_job(store, "job-1", "probe")
    with store.session() as session:
        session.execute(
            text(
                "INSERT INTO probe_points (job_id, layer, sublayer, space, metric, value, estimate) "
                "VALUES ('job-1', 3, 'mlp', 'embedding', '1-cos', 0.25, 0.2)"
            )
        )
    store.dispose()
    upgrade(url)
    assert _schema(url) == EXPECTED
    store = Store(url)
    with store.session() as session:
        old = session.scalars(select(ProbePoint)).one()
        assert (old.probe, old.layer, old.value) == ("counterfactual", 3, 0.25)
        session.add(
            ProbePoint(
                job_id="job-1", probe="generation-greedy", space="tokens", step=0, metric="agree", value=1.0
            )
        )
    store.dispose()
    engine = make_engine(url)
    index_columns = {
        index["name"]: index["column_names"] for index in inspect(engine).get_indexes("probe_points")
    }
    engine.dispose()
    assert index_columns == {"ix_probe_points_job_id_probe": ["job_id", "probe"]}

    command.downgrade(alembic_config(url), "0002")
    assert _schema(url) == BEFORE_0003
    store = Store(url)
    with store.session() as session:
        rows = session.execute(text("SELECT space, metric FROM probe_points ORDER BY id")).all()
        assert [tuple(row) for row in rows] == [("embedding", "1-cos"), ("tokens", "agree")]
    store.dispose()


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_progress_at_migration_keeps_running_jobs_and_downgrades_back(
    backend: str, scratch_pg_url: str, tmp_path: Path
) -> None:
    url = _url(backend, scratch_pg_url, tmp_path)
    upgrade(url, "0003")
    assert _schema(url) == BEFORE_0004
    store = Store(url)
    _insert_job(store, "job-1", "evaluate", status="running")
    upgrade(url)
    assert _schema(url) == EXPECTED
    with store.session() as session:
        job = session.get(Job, "job-1")
        assert job is not None and job.status == "running" and job.progress_at is None
    store.dispose()
    command.downgrade(alembic_config(url), "0003")
    assert _schema(url) == BEFORE_0004


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_profiles_migration_adds_the_profile_tables_and_downgrades_back(
    backend: str, scratch_pg_url: str, tmp_path: Path
) -> None:
    url = _url(backend, scratch_pg_url, tmp_path)
    upgrade(url, "0004")
    assert _schema(url) == BEFORE_0005
    store = Store(url)
    _insert_job(store, "job-1", "sweep", status="succeeded")
    upgrade(url)
    assert _schema(url) == EXPECTED
    with store.session() as session:
        assert session.get(Job, "job-1") is not None
    store.dispose()
    command.downgrade(alembic_config(url), "0004")
    assert _schema(url) == BEFORE_0005


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_spread_migration_keeps_old_points_without_a_spread_and_downgrades_back(
    backend: str, scratch_pg_url: str, tmp_path: Path
) -> None:
    url = _url(backend, scratch_pg_url, tmp_path)
    upgrade(url, "0005")
    assert _schema(url) == BEFORE_0006
    store = Store(url)
    _insert_job(store, "job-1", "probe", status="succeeded")
    with store.session() as session:
        session.execute(
            text(
                "INSERT INTO probe_points (job_id, probe, space, metric, value) "
                "VALUES ('job-1', 'model', 'probs', 'kl', 0.01)"
            )
        )
    store.dispose()
    upgrade(url)
    assert _schema(url) == EXPECTED
    store = Store(url)
    with store.session() as session:
        old = session.scalars(select(ProbePoint)).one()
        assert (old.value, old.n, old.stderr, old.value_min, old.value_max) == (0.01, None, None, None, None)
    store.dispose()
    command.downgrade(alembic_config(url), "0005")
    assert _schema(url) == BEFORE_0006


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_parent_migration_keeps_every_job_and_its_results_and_downgrades_back(
    backend: str, scratch_pg_url: str, tmp_path: Path
) -> None:
    url = _url(backend, scratch_pg_url, tmp_path)
    upgrade(url, "0006")
    assert _schema(url) == BEFORE_0007
    store = Store(url)
    _insert_job(store, "job-1", "sweep", status="succeeded")
    with store.session() as session:
        session.execute(
            text(
                "INSERT INTO results (job_id, model_id, method, sparsity, metric, dataset, protocol, value, "
                "source, created_at) VALUES ('job-1', 'm', 'dense', 0, 'ppl', 'w', '{}', 1.5, 'measured', "
                "CURRENT_TIMESTAMP)"
            )
        )
    store.dispose()
    upgrade(url)
    assert _schema(url) == EXPECTED
    store = Store(url)
    with store.session() as session:
        job = session.get(Job, "job-1")
        assert job is not None and job.parent_id is None
        assert session.scalar(text("SELECT count(*) FROM results")) == 1
    store.dispose()
    command.downgrade(alembic_config(url), "0006")
    assert _schema(url) == BEFORE_0007
    store = Store(url)
    with store.session() as session:
        assert session.scalar(text("SELECT count(*) FROM results")) == 1  # nothing cascaded away
    store.dispose()


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_profile_linears_migration_keeps_old_profiles_without_linears_and_downgrades_back(
    backend: str, scratch_pg_url: str, tmp_path: Path
) -> None:
    url = _url(backend, scratch_pg_url, tmp_path)
    upgrade(url, "0007")
    assert _schema(url) == BEFORE_0008
    store = Store(url)
    _insert_job(store, "job-1", "profile", status="succeeded")
    with store.session() as session:
        session.execute(
            text(
                "INSERT INTO profiles (job_id, model_id, family, hidden_size, num_layers, protocol, "
                "sparsities, widths, created_at) VALUES ('job-1', 'm', 'llama', 8, 1, '{}', '[0.5]', '[4]', "
                "CURRENT_TIMESTAMP)"
            )
        )
    store.dispose()
    upgrade(url)
    assert _schema(url) == EXPECTED
    store = Store(url)
    with store.session() as session:
        profile = session.scalars(select(Profile)).one()
        assert profile.linears == []
    store.dispose()
    command.downgrade(alembic_config(url), "0007")
    assert _schema(url) == BEFORE_0008
    store = Store(url)
    with store.session() as session:
        assert session.scalar(text("SELECT count(*) FROM profiles")) == 1
    store.dispose()


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_convention_migration_reads_old_points_as_prunecast_and_downgrades_back(
    backend: str, scratch_pg_url: str, tmp_path: Path
) -> None:
    url = _url(backend, scratch_pg_url, tmp_path)
    upgrade(url, "0008")
    assert _schema(url) == BEFORE_0009
    store = Store(url)
    _insert_job(store, "job-1", "probe", status="succeeded")
    with store.session() as session:
        session.execute(
            text(
                "INSERT INTO probe_points (job_id, probe, space, metric, value) "
                "VALUES ('job-1', 'model', 'probs', 'kl', 0.01)"
            )
        )
    store.dispose()
    upgrade(url)
    assert _schema(url) == EXPECTED
    store = Store(url)
    with store.session() as session:
        assert session.scalars(select(ProbePoint)).one().convention == "prunecast"
    store.dispose()
    command.downgrade(alembic_config(url), "0008")
    assert _schema(url) == BEFORE_0009
    store = Store(url)
    with store.session() as session:
        assert session.scalar(text("SELECT count(*) FROM probe_points")) == 1
    store.dispose()


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_generation_migration_counts_from_zero_and_downgrades_back(
    backend: str, scratch_pg_url: str, tmp_path: Path
) -> None:
    url = _url(backend, scratch_pg_url, tmp_path)
    upgrade(url, "0009")
    assert _schema(url) == BEFORE_0010
    store = Store(url)
    _insert_job(store, "job-1", "evaluate", status="succeeded")
    store.dispose()
    upgrade(url)
    assert _schema(url) == EXPECTED
    store = Store(url)
    with store.session() as session:
        assert session.scalar(text("SELECT generation FROM store_generation WHERE id = 1")) == 0
    store.dispose()
    command.downgrade(alembic_config(url), "0009")
    assert _schema(url) == BEFORE_0010
    store = Store(url)
    with store.session() as session:  # the triggers left with the table: writes still work
        session.execute(text("UPDATE jobs SET status = 'failed' WHERE id = 'job-1'"))
        assert session.scalar(text("SELECT count(*) FROM jobs")) == 1
    store.dispose()


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_dense_windows_migration_keeps_results_and_cascades_from_them(
    backend: str, scratch_pg_url: str, tmp_path: Path
) -> None:
    url = _url(backend, scratch_pg_url, tmp_path)
    upgrade(url, "0010")
    assert _schema(url) == BEFORE_0011
    store = Store(url)
    _insert_job(store, "job-1", "evaluate", status="succeeded")
    with store.session() as session:
        session.execute(
            text(
                "INSERT INTO results (id, job_id, model_id, method, sparsity, metric, dataset, protocol, "
                "value, source, created_at) VALUES (7, 'job-1', 'm', 'dense', 0, 'ppl', 'wikitext2', '{}', "
                "20.0, 'measured', CURRENT_TIMESTAMP)"
            )
        )
    store.dispose()
    upgrade(url)
    assert _schema(url) == EXPECTED
    store = Store(url)
    with store.session() as session:
        session.execute(
            text(
                "INSERT INTO dense_windows (result_id, scored_on, window_index, nll, created_at) "
                "VALUES (7, 'bfloat16 on cpu', 3, 3.25, CURRENT_TIMESTAMP)"
            )
        )
    with store.session() as session:
        session.execute(text("DELETE FROM results WHERE id = 7"))
        assert session.scalar(text("SELECT count(*) FROM dense_windows")) == 0
    store.dispose()
    command.downgrade(alembic_config(url), "0010")
    assert _schema(url) == BEFORE_0011
