"""Backtest records as the API shows them (GET /v1/backtests, and each answer's record): every
predictor in every mode over the store's curves of a method, with the rung it answers as.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.orm import Session

from app.schemas.profiles import (
    BacktestList,
    BacktestPublic,
    CurvePublic,
)
from app.schemas.records import summary_public
from app.services.prediction.scored_curves import scored_curves
from app.services.prediction.series import finite
from app.services.prediction.store_state import StoreState
from core.prediction.backtests import (
    CALIBRATED,
    POOLED_ALPHA,
    STRICT,
    Score,
)


def rung_of(predictor: str) -> str:
    """The rung a backtested predictor answers as."""
    if predictor.startswith("simulated"):
        return "simulated"
    if predictor == STRICT:
        return "strict"
    if predictor in (CALIBRATED, POOLED_ALPHA):
        return "law"
    return "profile"


def score_public(score: Score, *, points: bool = False) -> BacktestPublic:
    return BacktestPublic(
        rung=rung_of(score.predictor),
        predictor=score.predictor,
        mode=score.mode,
        level=score.level,
        n=score.n,
        curves=len({p.curve for p in score.points}),
        record=summary_public(score.summary),
        mape=finite(score.mape),
        max_ape=finite(score.max_ape),
        coverage=score.coverage,
        points=[
            {
                "curve": p.curve,
                "sparsity": p.sparsity,
                "measured": p.measured,
                "predicted": finite(p.predicted),  # null: the law overflows a float there
                "band": None if p.band is None else [finite(v) for v in p.band],
                "ape": finite(p.ape),
                "covered": p.covered,
                "fitted_on": p.fitted_on,
            }
            for p in score.points
        ]
        if points
        else None,
    )


def backtest_list(
    session: Session,
    method: str,
    level: float,
    *,
    points: bool = False,
    extra: Sequence[Score] = (),
    state: StoreState | None = None,
) -> BacktestList:
    """Every predictor in every mode over the store's curves of `method`, and `extra` records (the
    simulated rung's, the nested choice's)."""
    scored = scored_curves(session, method, level, state)
    curves = scored.curves
    return BacktestList(
        method=method,
        level=level,
        curves=[
            CurvePublic(
                label=c.label,
                model=c.model,
                method=c.method,
                ppl0=c.ppl0,
                points=[[s, v] for s, v in c.points],
                features=sorted(c.features),
            )
            for c in curves
        ],
        items=[score_public(score, points=points) for score in [*extra, *scored.scores] if score.n],
    )
