"""/v1/backtests: every predictor scored on the store's measured curves it did not see."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from app.deps import SessionDep
from app.schemas.profiles import BacktestList
from app.services.profiles import backtest_list
from core.laws import DEFAULT_LEVEL
from core.specs.pruning import StoredMethod

router = APIRouter(prefix="/v1/backtests", tags=["predictions"])


@router.get("", response_model=BacktestList)
def list_backtests(
    session: SessionDep,
    method: Annotated[StoredMethod, Query(description="Method whose stored curves are scored.")] = "slicegpt",
    level: Annotated[
        float, Query(ge=0.5, le=0.999, description="Coverage of the stated bands.")
    ] = DEFAULT_LEVEL,
    points: Annotated[bool, Query(description="Include every held-out point.")] = False,
) -> BacktestList:
    """For every law and predictor, the error of its predictions on measured points it did not see,
    over every perplexity curve of `method` in the store: the feature laws with zero points of the
    held-out curve (coefficient pooled from the other curves, or from other models only) and with
    one point; the strict law; the calibrated laws fitted on one point and on all but one sparsity.
    MAPE, max APE and the coverage of the stated band at `level`. Curves without a profile of their
    model under their calibration score only the strict and calibrated laws."""
    return backtest_list(session, method, level, points=points)
