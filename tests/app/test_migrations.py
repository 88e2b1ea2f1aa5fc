"""Migrations build the same schema as the ORM tables, on Postgres and SQLite, and go both ways."""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
import pytest
from alembic import command
from sqlalchemy import inspect

from app.db import make_engine
from app.migrate import alembic_config, pending_migrations, upgrade
from app.tables import Base
from tests.conftest import PG_ADMIN_URL


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


@pytest.fixture
def scratch_pg_url() -> str:
    name = f"prunecast_mig_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield f"{PG_ADMIN_URL.rsplit('/', 1)[0].replace('postgresql://', 'postgresql+psycopg://', 1)}/{name}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


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
