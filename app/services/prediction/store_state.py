"""What predictions read, summed up in one primary-key read: the store's generation, a counter that
triggers bump whenever a result, fit or profile is written or deleted, or a job enters or leaves
`succeeded` (`core.store_generation`). Records, priors, profile answers and whole answers are
computed once per generation rather than on every request.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from core.async_reads import AsyncReader
from core.store import Store
from core.tables import StoreGeneration

T = TypeVar("T")
StoreState = tuple[Any, ...]

STATE_STATEMENT = select(StoreGeneration.generation).where(StoreGeneration.id == 1)
"""Built once: compiled once per process, then one round trip per request."""


def store_state(source: Session | Store) -> StoreState:
    """The store's state as predictions see it (its URL and generation): on the store's autocommit
    reader (no transaction around it) when given the store, else in the session."""
    if isinstance(source, Store):
        (row,) = source.read(STATE_STATEMENT)
        return (source.url, *row)
    row = source.execute(STATE_STATEMENT).one()
    return (str(source.get_bind().engine.url), *row)


async def awaited_store_state(store: Store, reader: AsyncReader | None) -> StoreState:
    """`store_state` for a request on the event loop: awaited on `reader` where the store is
    PostgreSQL, else read in the threadpool."""
    if reader is None:
        return await run_in_threadpool(store_state, store)
    (row,) = await reader.read(STATE_STATEMENT)
    return (store.url, *row)


class StateCache:
    """A small LRU of answers computed from the store, keyed by its state and the question."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._entries: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()

    def peek(self, key: Hashable) -> Any | None:
        """The entry under `key` (now the most recently used), or None."""
        with self._lock:
            if key not in self._entries:
                return None
            self._entries.move_to_end(key)
            return self._entries[key]

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                found: T = self._entries[key]
                return found
        value = compute()
        with self._lock:
            self._entries[key] = value
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
