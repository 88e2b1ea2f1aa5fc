"""Keyset pagination: the id of the last row a client saw is its cursor.

Ids only grow (UUIDv7 for jobs, integers elsewhere), so "id < cursor" (newest first) and
"id > cursor" (oldest first) pages stay stable while new rows arrive, unlike offsets.
"""

from __future__ import annotations

from typing import Any, TypeVar

from sqlalchemy import Select
from sqlalchemy.orm import InstrumentedAttribute, Session

Row = TypeVar("Row")


def keyset_page(
    session: Session,
    query: Select[Row],
    id_column: InstrumentedAttribute[Any],
    cursor: Any | None,
    limit: int,
    *,
    newest_first: bool,
) -> tuple[list[Row], str | None]:
    """One page of `query`'s rows and the cursor of the next page (None at the end).

    `newest_first` pages by descending id (jobs, results, fits); otherwise by ascending id, the
    order the rows were stored in (probe points: layer by layer).
    """
    if cursor is not None:
        query = query.where(id_column < cursor if newest_first else id_column > cursor)
    order = id_column.desc() if newest_first else id_column.asc()
    rows = session.scalars(query.order_by(order).limit(limit + 1)).all()
    page = list(rows[:limit])
    next_cursor = str(getattr(page[-1], id_column.key)) if len(rows) > limit else None
    return page, next_cursor
