"""The store: database engine and sessions, shared by the API, the workers and the CLI.

PostgreSQL in production, a SQLite file in the embedded deployment. It is the source of truth, so
both sides must live through it going away for a few seconds: `is_outage` tells a passing outage
(connection refused or dropped, pool exhausted, database locked) from a real error, and
`Store.retrying` runs one transaction again until it succeeds or a deadline passes.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import structlog
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.sql import Executable

log = structlog.get_logger(__name__)

T = TypeVar("T")

CONNECT_TIMEOUT_S = 5
"""Seconds a new PostgreSQL connection may take: a request or a worker write fails over to the
outage path in this time rather than hanging on an unreachable host."""
RETRY_FIRST_DELAY_S = 0.2
RETRY_MAX_DELAY_S = 2.0


class StoreUnavailable(RuntimeError):
    """The store stayed unreachable for longer than the caller was willing to wait."""


SQLITE_PASSING = ("database is locked", "unable to open database", "disk i/o error")
"""The SQLite OperationalErrors that retrying can cure (others, e.g. "no such table", are bugs)."""


def is_outage(error: BaseException) -> bool:
    """True for errors that mean "the store is not reachable right now" rather than a bad statement:
    retrying later can succeed. (An integrity or data error is never an outage.) PostgreSQL's
    OperationalErrors are connection trouble (refused, dropped, shut down, canceled); SQLite's are
    only when the message says the file is busy or unavailable."""
    if isinstance(error, StoreUnavailable | InterfaceError | PoolTimeoutError):
        return True
    if isinstance(error, OperationalError):
        if isinstance(error.orig, sqlite3.Error):
            return any(text in str(error.orig).lower() for text in SQLITE_PASSING)
        return True
    return isinstance(error, DBAPIError) and bool(error.connection_invalidated)


def make_engine(url: str) -> Engine:
    """An engine tuned for the backend: WAL and a busy timeout on SQLite; on Postgres pre-ping (a
    connection that died in an outage is replaced, not handed out) and a connect timeout."""
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
    return create_engine(
        url,
        pool_pre_ping=True,
        pool_size=10,
        max_overflow=20,
        connect_args={"connect_timeout": CONNECT_TIMEOUT_S},
    )


def make_reader(engine: Engine) -> Engine:
    """An engine for single-statement reads on hot paths (predictions, curves). On Postgres it runs in
    autocommit without the pre-ping: one round trip per read instead of four (ping, BEGIN, SELECT,
    ROLLBACK); ``Store.read`` retries once on a connection that went stale. No connection is opened
    until the first read. SQLite: the engine itself."""
    if engine.url.get_backend_name() == "sqlite":
        return engine
    return create_engine(
        engine.url,
        isolation_level="AUTOCOMMIT",
        pool_pre_ping=False,
        pool_size=10,
        max_overflow=20,
        connect_args={"connect_timeout": CONNECT_TIMEOUT_S},
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

    def retrying(self, work: Callable[[Session], T], *, within_s: float, what: str) -> T:
        """Run `work` in its own transaction, again after each outage, until it commits or `within_s`
        seconds have passed (then StoreUnavailable). Errors that are not outages propagate at once.
        `work` must be safe to run again: a failed attempt's transaction was rolled back."""
        deadline = time.monotonic() + within_s
        delay = RETRY_FIRST_DELAY_S
        tries = 0
        while True:
            tries += 1
            try:
                with self.session() as session:
                    return work(session)
            except Exception as error:
                if not is_outage(error):
                    raise
                if time.monotonic() + delay > deadline:
                    raise StoreUnavailable(
                        f"the store stayed unreachable for {within_s:g}s ({tries} tries) while {what}: "
                        f"{type(error).__name__}"
                    ) from error
                log.warning("store unreachable; retrying", what=what, tries=tries, error=type(error).__name__)
                time.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_DELAY_S)

    def dispose(self) -> None:
        if self.reader is not self.engine:
            self.reader.dispose()
        self.engine.dispose()
