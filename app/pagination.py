"""Keyset pagination, newest first: the id of the last row a client saw is its cursor.

Ids only grow (UUIDv7 for jobs, integers elsewhere), so "id < cursor" pages stay stable while
new rows arrive, unlike offsets.
"""

from __future__ import annotations

from typing import Any, TypeVar

from sqlalchemy import Select
from sqlalchemy.orm import InstrumentedAttribute, Session

Row = TypeVar("Row")


def newest_first(
    session: Session,
    query: Select[Row],
    id_column: InstrumentedAttribute[Any],
    cursor: Any | None,
    limit: int,
) -> tuple[list[Row], str | None]:
    """One page of `query`'s rows, newest first, and the cursor of the next page (None at the end)."""
    if cursor is not None:
        query = query.where(id_column < cursor)
    rows = session.scalars(query.order_by(id_column.desc()).limit(limit + 1)).all()
    page = list(rows[:limit])
    next_cursor = str(getattr(page[-1], id_column.key)) if len(rows) > limit else None
    return page, next_cursor
