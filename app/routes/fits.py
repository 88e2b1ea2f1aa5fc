"""/v1/fits: the prediction laws fitted to measured points (by `sweep` jobs), filterable.

One endpoint serves both questions: "what calibration does the store hold for this model?"
(`?model=...&method=...&metric=...`) and "what did this sweep fit?" (`?job_id=...`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi import Path as PathParam
from pydantic import BaseModel, Field
from sqlalchemy import select

from app.deps import SessionDep
from app.pagination import keyset_page
from app.problems import Problem, ProblemError
from app.tables import Fit

router = APIRouter(prefix="/v1/fits", tags=["fits"])


class FitPointPublic(BaseModel):
    sparsity: float = Field(description="0 is the dense baseline the laws are anchored at.")
    value: float | None = Field(description="The measured value; null when it was not finite.")
    result_id: int | None = Field(description="The result row it was measured as (`/v1/results`).")
    used: bool = Field(description="False when left out of the fit (e.g. an infinite perplexity).")


class LawQualityPublic(BaseModel):
    """How one law matched the measured points it was fitted on."""

    n: int = Field(description="Pruned points compared.")
    r2: float | None = Field(description="Coefficient of determination; null with fewer than 2 points.")
    max_ape: float | None = Field(description="Largest absolute percentage error, as a fraction.")
    mean_ape: float | None = Field(description="Mean absolute percentage error, as a fraction.")
    loo_rel_error: float | None = Field(
        description="RMS relative error predicting each point from the others (leave-one-out); "
        "null when too few points or for the strict law, which has nothing fitted."
    )
    formula: str
    params: dict[str, float | None]
    sigma: float | None = Field(
        description="Relative error of one measurement about the law (prior pooled with residuals)."
    )
    band_from_prior: bool | None = Field(
        description="True when sigma is the prior alone (no spare points); null for the strict law."
    )


class FitPublic(BaseModel):
    """A law fitted to one model's measured points under one method, metric and protocol."""

    id: int
    job_id: str | None
    model: str
    model_revision: str | None
    method: str
    metric: str
    dataset: str
    protocol: dict[str, Any] = Field(
        description="What the points share: perplexity protocol (seqlen, max_windows, data_sha256, "
        "dtype), calibration windows, round_to, slice_head."
    )
    law: str = Field(description="The chosen law: `alpha` (one parameter) or `affine` (two).")
    formula: str
    params: dict[str, float | None]
    baseline: float = Field(description="The measured dense value the law is anchored at (PPL0).")
    points: list[FitPointPublic] = Field(description="Dense point first, then by sparsity.")
    quality: dict[str, LawQualityPublic] = Field(
        description="Per law (each candidate, and `strict` for perplexity) on the measured points."
    )
    chosen_reason: str
    created_at: datetime


class FitList(BaseModel):
    items: list[FitPublic]
    next_cursor: str | None = Field(None, description="Pass as `cursor` to get the next page.")


def fit_public(row: Fit) -> FitPublic:
    return FitPublic(
        id=row.id,
        job_id=row.job_id,
        model=row.model_id,
        model_revision=row.model_revision,
        method=row.method,
        metric=row.metric,
        dataset=row.dataset,
        protocol=row.protocol,
        law=row.law,
        formula=row.formula,
        params=row.params,
        baseline=row.baseline,
        points=[FitPointPublic.model_validate(point) for point in row.points],
        quality={law: LawQualityPublic.model_validate(q) for law, q in row.quality.items()},
        chosen_reason=row.chosen_reason,
        created_at=row.created_at,
    )


@router.get("", response_model=FitList)
def list_fits(
    session: SessionDep,
    model: Annotated[str | None, Query(max_length=512)] = None,
    method: Annotated[str | None, Query(max_length=32, description="e.g. `slicegpt`.")] = None,
    metric: Annotated[str | None, Query(max_length=64, description="e.g. `ppl`.")] = None,
    dataset: Annotated[str | None, Query(max_length=128, description="e.g. `wikitext2`.")] = None,
    job_id: Annotated[str | None, Query(max_length=36, description="Fits stored by this job.")] = None,
    cursor: Annotated[
        int | None, Query(ge=0, le=2**62, description="`next_cursor` of the previous page.")
    ] = None,
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
    return FitList(items=[fit_public(row) for row in page], next_cursor=next_cursor)


@router.get(
    "/{fit_id}",
    response_model=FitPublic,
    responses={404: {"model": Problem, "description": "No such fit"}},
)
def get_fit(fit_id: Annotated[int, PathParam(ge=0, le=2**62)], session: SessionDep) -> FitPublic:
    """One fitted law with its points and the quality of every candidate law."""
    row = session.get(Fit, fit_id)
    if row is None:
        raise ProblemError(404, f"no fit with id {fit_id}", slug="fit-not-found")
    return fit_public(row)
