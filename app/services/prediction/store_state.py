"""What predictions read, summed up in one round trip, so that their records, priors and profile
answers are computed when the store changes rather than on every request.

Results, fits and profiles are only ever inserted or deleted, so their count, largest id and newest
creation time change whenever their content does (a reused id comes with a newer time); a job that
succeeds changes the count of succeeded jobs and their newest finish time (a simulation's rows count
only once its job has succeeded).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from core.store import Store
from core.tables import Fit, Job, JobStatus, Profile, Result

T = TypeVar("T")
StoreState = tuple[Any, ...]


def _state_statement() -> Select[Any]:
    columns = []
    for table in (Result, Fit, Profile):
        columns += [
            select(func.count(table.id)).scalar_subquery(),
            select(func.max(table.id)).scalar_subquery(),
            select(func.max(table.created_at)).scalar_subquery(),
        ]
    succeeded = Job.status == JobStatus.succeeded
    columns += [
        select(func.count(Job.id)).where(succeeded).scalar_subquery(),
        select(func.max(Job.finished_at)).where(succeeded).scalar_subquery(),
    ]
    return select(*columns)


STATE_STATEMENT = _state_statement()
"""Built once: compiled once per process, then one round trip per request."""


def store_state(source: Session | Store) -> StoreState:
    """The store's state as predictions see it, in one statement: on the store's autocommit reader
    (no transaction around it) when given the store, else in the session."""
    if isinstance(source, Store):
        (row,) = source.read(STATE_STATEMENT)
        return (source.url, *row)
    row = source.execute(STATE_STATEMENT).one()
    return (str(source.get_bind().engine.url), *row)


class StateCache:
    """A small LRU of answers computed from the store, keyed by its state and the question."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._entries: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()

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
