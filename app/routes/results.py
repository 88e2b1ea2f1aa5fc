"""/v1/results: every measured number, with the protocol that produced it, filterable."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query
from fastapi.exceptions import RequestValidationError
from sqlalchemy import select

from app.deps import CursorQuery, SessionDep
from app.pagination import keyset_page
from app.schemas.results import ResultList, ResultPublic
from core.tables import Result

router = APIRouter(prefix="/v1/results", tags=["results"])


@router.get("", response_model=ResultList)
def list_results(
    session: SessionDep,
    model: Annotated[str | None, Query(max_length=512)] = None,
    method: Annotated[str | None, Query(max_length=32, description="e.g. `dense`, `slicegpt`.")] = None,
    metric: Annotated[str | None, Query(max_length=64, description="e.g. `ppl`, `acc`.")] = None,
    dataset: Annotated[str | None, Query(max_length=128, description="e.g. `wikitext2`.")] = None,
    sparsity_min: Annotated[
        float | None, Query(ge=0, le=1, description="At most `sparsity_max` when both are given (422).")
    ] = None,
    sparsity_max: Annotated[
        float | None, Query(ge=0, le=1, description="At least `sparsity_min` when both are given (422).")
    ] = None,
    job_id: Annotated[str | None, Query(max_length=36)] = None,
    source: Annotated[
        Literal["measured", "published", "simulated"] | None,
        Query(
            description="`measured` here, `published` (imported with `prunecast import-published`) or "
            "`simulated` (by `simulate` jobs, never mixed into measured curves)."
        ),
    ] = None,
    cursor: CursorQuery = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> ResultList:
    """Results, newest first, with filters and cursor pagination. An empty sparsity range
    (`sparsity_min` above `sparsity_max`) is a 422: one query parameter's schema cannot refer to
    another's, so the spec says it in their descriptions."""
    if sparsity_min is not None and sparsity_max is not None and sparsity_min > sparsity_max:
        message = f"sparsity_min ({sparsity_min:g}) must not exceed sparsity_max ({sparsity_max:g})"
        raise RequestValidationError(
            [{"loc": ("query", "sparsity_min"), "msg": message, "type": "value_error", "input": sparsity_min}]
        )
    query = select(Result)
    filters = {
        Result.model_id: model,
        Result.method: method,
        Result.metric: metric,
        Result.dataset: dataset,
        Result.job_id: job_id,
        Result.source: source,
    }
    for column, wanted in filters.items():
        if wanted is not None:
            query = query.where(column == wanted)
    if sparsity_min is not None:
        query = query.where(Result.sparsity >= sparsity_min)
    if sparsity_max is not None:
        query = query.where(Result.sparsity <= sparsity_max)
    page, next_cursor = keyset_page(session, query, Result.id, cursor, limit, newest_first=True)
    return ResultList(items=[ResultPublic.model_validate(row) for row in page], next_cursor=next_cursor)
