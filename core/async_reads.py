"""Reads awaited on the API's event loop, for the one hot path that reads the store on every request.

POST /v1/predictions serves most requests from its answer cache after one primary-key read (the
store's generation, `app.services.prediction.store_state`). Handed to the threadpool, that read made
eight connections on one uvicorn worker queue for each other's GIL slices: p99 47-59 ms against 5 ms
for /healthz. Awaited on the loop through psycopg's own async connections it took 4.7 ms
(bench/README.md, "Load").

PostgreSQL only: SQLite has no async driver here, and its reads stay in the threadpool.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from contextlib import suppress
from typing import Any

import psycopg
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import make_url
from sqlalchemy.sql import Select

from core.store import CONNECT_TIMEOUT_S, StoreUnavailable

APPLICATION_NAME = "prunecast-async-reads"
"""How these connections name themselves in pg_stat_activity."""

CONNECTIONS = 4
"""Connections at most: enough that a burst of one-row reads never waits on a round trip for long,
few enough to leave PostgreSQL's slots to the sync pools (each read takes well under 1 ms)."""


class AsyncReader:
    """Single-statement, autocommit reads on a few psycopg async connections, opened on first use
    and bound to the event loop that first reads (one per process: the app's lifespan). A dropped
    connection is replaced and the read retried once; a store still unreachable raises
    `StoreUnavailable`, which the API answers with its 503."""

    def __init__(self, url: str, connections: int = CONNECTIONS) -> None:
        self._conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        self._slots = asyncio.Semaphore(connections)
        self._idle: list[psycopg.AsyncConnection[Any]] = []
        self._sql: dict[int, tuple[Select[Any], str]] = {}  # the statement kept alive: its id stays its

    @classmethod
    def for_url(cls, url: str) -> AsyncReader | None:
        """A reader for a PostgreSQL store, None for any other backend."""
        return cls(url) if make_url(url).get_backend_name() == "postgresql" else None

    async def read(self, statement: Select[Any]) -> Sequence[tuple[Any, ...]]:
        """All rows of one read-only statement without bound parameters (literals are inlined once
        per statement object, which callers build once)."""
        sql = self._compiled(statement)
        async with self._slots:
            try:
                return await self._read_once(sql)
            except psycopg.OperationalError:
                await self.close()  # a server restart drops every idle connection: retry on a fresh one
            try:
                return await self._read_once(sql)
            except psycopg.OperationalError as error:
                raise StoreUnavailable(f"the store is unreachable: {error}") from error

    async def close(self) -> None:
        """Close the idle connections (the app's shutdown)."""
        idle, self._idle = self._idle, []
        for connection in idle:
            with suppress(psycopg.Error):
                await connection.close()

    async def _read_once(self, sql: str) -> Sequence[tuple[Any, ...]]:
        connection = self._idle.pop() if self._idle else await self._connect()
        try:
            cursor = await connection.execute(sql)
            rows = await cursor.fetchall()
        except BaseException:
            with suppress(psycopg.Error):
                await connection.close()  # never back to the idle list in an unknown state
            raise
        self._idle.append(connection)
        return rows

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(
            self._conninfo,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT_S,
            application_name=APPLICATION_NAME,
        )

    def _compiled(self, statement: Select[Any]) -> str:
        key = id(statement)
        if key not in self._sql:
            compiled = statement.compile(dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True})
            self._sql[key] = (statement, str(compiled))
        return self._sql[key][1]
