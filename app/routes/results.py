"""/v1/results: every measured (and, later, predicted) number, filterable."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from sqlalchemy import select

from app.deps import SessionDep
from app.pagination import keyset_page
from app.problems import ProblemError
from app.schemas import ResultList, ResultPublic
from app.tables import Result

router = APIRouter(prefix="/v1/results", tags=["results"])


def result_public(row: Result) -> ResultPublic:
    return ResultPublic(
        id=row.id,
        job_id=row.job_id,
        model=row.model_id,
        model_revision=row.model_revision,
        method=row.method,
        sparsity=row.sparsity,
        metric=row.metric,
        dataset=row.dataset,
        split=row.split,
        value=row.value,
        stderr=row.stderr,
        n=row.n,
        source=row.source,
        law=row.law,
        protocol=row.protocol,
        created_at=row.created_at,
    )


@router.get("", response_model=ResultList)
def list_results(
    session: SessionDep,
    model: Annotated[str | None, Query(max_length=512)] = None,
    method: Annotated[str | None, Query(max_length=32, description="e.g. `dense`, `slicegpt`.")] = None,
    metric: Annotated[str | None, Query(max_length=64, description="e.g. `ppl`, `acc`.")] = None,
    dataset: Annotated[str | None, Query(max_length=128, description="e.g. `wikitext2`.")] = None,
    sparsity_min: Annotated[float | None, Query(ge=0, le=1)] = None,
    sparsity_max: Annotated[float | None, Query(ge=0, le=1)] = None,
    job_id: Annotated[str | None, Query(max_length=36)] = None,
    cursor: Annotated[
        int | None, Query(ge=0, le=2**62, description="`next_cursor` of the previous page.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> ResultList:
    """Results, newest first, with filters and cursor pagination."""
    if sparsity_min is not None and sparsity_max is not None and sparsity_min > sparsity_max:
        raise ProblemError(422, "sparsity_min must not exceed sparsity_max", slug="validation-error")
    query = select(Result)
    filters = {
        Result.model_id: model,
        Result.method: method,
        Result.metric: metric,
        Result.dataset: dataset,
        Result.job_id: job_id,
    }
    for column, wanted in filters.items():
        if wanted is not None:
            query = query.where(column == wanted)
    if sparsity_min is not None:
        query = query.where(Result.sparsity >= sparsity_min)
    if sparsity_max is not None:
        query = query.where(Result.sparsity <= sparsity_max)
    page, next_cursor = keyset_page(session, query, Result.id, cursor, limit, newest_first=True)
    return ResultList(items=[result_public(row) for row in page], next_cursor=next_cursor)
