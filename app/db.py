"""Database engine and sessions, shared by the API, the workers and the CLI."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.sql import Executable


def make_engine(url: str) -> Engine:
    """An engine tuned for the backend: WAL and a busy timeout on SQLite, pre-ping on Postgres."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(connection: Any, _record: Any) -> None:
            cursor = connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


def make_reader(engine: Engine) -> Engine:
    """An engine for single-statement reads on hot paths (predictions, curves). On Postgres it runs in
    autocommit without the pre-ping: one round trip per read instead of four (ping, BEGIN, SELECT,
    ROLLBACK); ``Store.read`` retries once on a connection that went stale. No connection is opened
    until the first read. SQLite: the engine itself."""
    if engine.url.get_backend_name() == "sqlite":
        return engine
    return create_engine(
        engine.url, isolation_level="AUTOCOMMIT", pool_pre_ping=False, pool_size=10, max_overflow=20
    )


class Store:
    """The engine and a session factory; one per process."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        self.reader = make_reader(self.engine)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session that commits on success and rolls back on error."""
        with self.sessions() as session:
            try:
                yield session
                session.commit()
            except BaseException:
                session.rollback()
                raise

    def read(self, statement: Executable, parameters: dict[str, Any] | None = None) -> Sequence[Any]:
        """All rows of one read-only statement, on ``reader``."""
        try:
            with self.reader.connect() as connection:
                return connection.execute(statement, parameters).all()
        except DBAPIError as error:
            if not error.connection_invalidated:
                raise
        with self.reader.connect() as connection:  # the pool has dropped its stale connections
            return connection.execute(statement, parameters).all()

    def dispose(self) -> None:
        if self.reader is not self.engine:
            self.reader.dispose()
        self.engine.dispose()
