"""Reads awaited on the event loop (core.async_reads): they see each commit, survive a server that
drops their connections, hold at most their few connections, and report an unreachable store as
`StoreUnavailable` (which the API answers with a 503)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import text

from app.services.prediction.store_state import STATE_STATEMENT, store_state
from core.async_reads import APPLICATION_NAME, CONNECTIONS, AsyncReader
from core.migrate import upgrade
from core.store import Store, StoreUnavailable
from tests.conftest import scratch_database, wait_for

pytestmark = pytest.mark.services


@pytest.fixture
def store() -> Iterator[Store]:
    """A database of its own: the test terminates its reader's connections by application name."""
    with scratch_database("prunecast_async") as url:
        upgrade(url)
        store = Store(url)
        yield store
        store.dispose()


def _libpq(store: Store) -> str:
    return store.url.replace("postgresql+psycopg://", "postgresql://", 1)


def _reader_backends(store: Store) -> int:
    with psycopg.connect(_libpq(store), autocommit=True) as admin:
        (count,) = admin.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE application_name = %s AND datname = current_database()",
            (APPLICATION_NAME,),
        ).fetchone()  # type: ignore[misc]
        return int(count)


def _bump(store: Store) -> None:
    with store.session() as session:
        session.execute(text("UPDATE store_generation SET generation = generation + 1 WHERE id = 1"))


def test_a_read_sees_each_commit_and_agrees_with_the_threaded_read(store: Store) -> None:
    reader = AsyncReader.for_url(store.url)
    assert reader is not None

    async def read_twice() -> tuple[int, int]:
        try:
            ((before,),) = await reader.read(STATE_STATEMENT)
            _bump(store)
            ((after,),) = await reader.read(STATE_STATEMENT)
            return before, after
        finally:
            await reader.close()

    before, after = asyncio.run(read_twice())
    assert after == before + 1
    assert store_state(store) == (store.url, after)


def test_a_dropped_connection_is_replaced_and_the_read_retried(store: Store) -> None:
    reader = AsyncReader(store.url)

    async def read_across_a_drop() -> int:
        try:
            await asyncio.gather(*(reader.read(STATE_STATEMENT) for _ in range(3)))  # several idle
            with psycopg.connect(_libpq(store), autocommit=True) as admin:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
                    (APPLICATION_NAME,),
                )
            await asyncio.sleep(0.2)
            ((generation,),) = await reader.read(STATE_STATEMENT)
            return int(generation)
        finally:
            await reader.close()

    assert asyncio.run(read_across_a_drop()) == store_state(store)[1]


def test_a_burst_of_reads_holds_at_most_its_connections(store: Store) -> None:
    reader = AsyncReader(store.url)

    async def burst() -> int:
        try:
            rows = await asyncio.gather(*(reader.read(STATE_STATEMENT) for _ in range(50)))
            assert len({row[0][0] for row in rows}) == 1
            return _reader_backends(store)
        finally:
            await reader.close()

    assert 1 <= asyncio.run(burst()) <= CONNECTIONS
    # Closed with the app: the server reaps a closed backend a moment after the client hangs up.
    wait_for(lambda: _reader_backends(store) == 0, 10, "the reader's backends to end")


def test_an_unreachable_store_is_store_unavailable() -> None:
    reader = AsyncReader("postgresql+psycopg://postgres@127.0.0.1:1/test")  # nothing listens on port 1
    with pytest.raises(StoreUnavailable, match="unreachable"):
        asyncio.run(reader.read(STATE_STATEMENT))


def test_only_postgresql_stores_get_a_reader() -> None:
    assert AsyncReader.for_url("sqlite:///store.db") is None
    assert AsyncReader.for_url("postgresql+psycopg://postgres@127.0.0.1:5432/test") is not None
