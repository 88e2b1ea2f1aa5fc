"""/v1/backtests: every predictor scored on the store's measured curves it did not see."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from app.deps import SessionDep
from app.schemas.profiles import BacktestList
from app.services.prediction.profile_rung import nested_choice_score
from app.services.prediction.records import backtest_list
from app.services.prediction.scored_curves import scored_curves
from app.services.prediction.simulated import simulation_records
from app.services.prediction.store_state import store_state
from core.prediction.backtests import feature_predictor
from core.prediction.law_prediction import DEFAULT_LEVEL
from core.prediction.registry import PROFILE_PREDICTORS
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
    """For every rung, law and predictor, the error of its predictions on measured points it did not
    see, over every perplexity curve of `method` in the store: the simulations against the measured
    points of the same model, protocol and calibration (face values, and anchored ones off their
    anchors); the feature laws with zero points of the held-out curve (coefficient pooled from the
    other curves, or from other models only), the nested choice between carrying over and pooling,
    and one point; the strict law; the calibrated laws fitted on one point and on all but one
    sparsity, and the alpha law pooled over other models. Each with its |ln| record pooled
    model -> curve (what verdicts read), MAPE for comparison, and the coverage of the stated band at
    `level`. Curves without a profile of their model under their calibration score only the laws."""
    state = store_state(session)
    extra = list(simulation_records(session, method, level, state).values())
    registered = PROFILE_PREDICTORS.get(method)
    if registered is not None:
        scored = scored_curves(session, method, level, state)
        scores = {(score.predictor, score.mode): score for score in scored.scores}
        extra.append(nested_choice_score(scores, feature_predictor(registered.feature), level))
    return backtest_list(session, method, level, points=points, extra=extra, state=state)
