"""/v1/fits: the prediction laws fitted to measured points (by `sweep` jobs), filterable.

One endpoint serves both questions: "what calibration does the store hold for this model?"
(`?model=...&method=...&metric=...`) and "what did this sweep fit?" (`?job_id=...`).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from sqlalchemy import select

from app.deps import CursorQuery, SessionDep
from app.pagination import keyset_page
from app.problems import ProblemError, problem_responses
from app.schemas.fits import FitList, FitPublic
from core.tables import MAX_ROW_ID, Fit

router = APIRouter(prefix="/v1/fits", tags=["fits"])


@router.get("", response_model=FitList)
def list_fits(
    session: SessionDep,
    model: Annotated[str | None, Query(max_length=512)] = None,
    method: Annotated[str | None, Query(max_length=32, description="e.g. `slicegpt`.")] = None,
    metric: Annotated[str | None, Query(max_length=64, description="e.g. `ppl`.")] = None,
    dataset: Annotated[str | None, Query(max_length=128, description="e.g. `wikitext2`.")] = None,
    job_id: Annotated[str | None, Query(max_length=36, description="Fits stored by this job.")] = None,
    cursor: CursorQuery = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> FitList:
    """Fitted laws, newest first, with filters and cursor pagination."""
    query = select(Fit)
    filters = {
        Fit.model_id: model,
        Fit.method: method,
        Fit.metric: metric,
        Fit.dataset: dataset,
        Fit.job_id: job_id,
    }
    for column, wanted in filters.items():
        if wanted is not None:
            query = query.where(column == wanted)
    page, next_cursor = keyset_page(session, query, Fit.id, cursor, limit, newest_first=True)
    return FitList(items=[FitPublic.model_validate(row) for row in page], next_cursor=next_cursor)


@router.get("/{fit_id}", response_model=FitPublic, responses=problem_responses({404: "No such fit"}))
def get_fit(fit_id: Annotated[int, Path(ge=0, le=MAX_ROW_ID)], session: SessionDep) -> FitPublic:
    """One fitted law with its points and the quality of every candidate law."""
    row = session.get(Fit, fit_id)
    if row is None:
        raise ProblemError(404, f"no fit with id {fit_id}", slug="fit-not-found")
    return FitPublic.model_validate(row)
