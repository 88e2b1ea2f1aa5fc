"""How a record and its verdict travel: the |ln| miss pooled model -> curve, and what it rests on."""

from __future__ import annotations

import math

from pydantic import BaseModel, Field

from core.prediction.records import (
    MIN_MODELS_NEW,
    RELIABLE_FACTOR,
    ROUGH_FACTOR,
    Summary,
    Verdict,
    VerdictLevel,
)

VERDICT_LEVELS = (
    f"`measured`: the point itself; `exact`: a simulation that is the pruned model by construction; "
    f"from a backtest's typical |ln| miss: at most x{RELIABLE_FACTOR:g} `reliable`, at most "
    f"x{ROUGH_FACTOR:g} `rough`, above that `unreliable`; `unscored` without a record (for a model "
    f"nobody has measured: without one over at least {MIN_MODELS_NEW} models)."
)


class SummaryPublic(BaseModel):
    """A record in numbers: |ln(predicted / measured)| pooled over models, then curves, then points."""

    points: int
    curves: int
    models: int
    log_error: float | None = Field(description="Typical miss: the pooled mean |ln(predicted / measured)|.")
    factor: float | None = Field(description="exp(log_error): 1.2 is 20 % either way.")
    percent: float | None = Field(description="factor - 1, as a fraction.")
    worst_log_error: float | None
    sigma: float | None = Field(description="Pooled RMS |ln| miss: the sd a band built on it uses.")
    coverage: float | None = Field(description="Share of held-out points inside their band (null: no band).")


class VerdictPublic(BaseModel):
    level: VerdictLevel = Field(description=VERDICT_LEVELS)
    advice: str = Field(description="The record behind the level, and what to do about it.")
    models: int = Field(description="Models the record rests on.")
    curves: int = Field(description="Curves the record rests on.")
    points: int = Field(description="Held-out points the record rests on.")


def summary_public(summary: Summary) -> SummaryPublic:
    factor = _finite(summary.factor)
    return SummaryPublic(
        points=summary.points,
        curves=summary.curves,
        models=summary.models,
        log_error=_finite(summary.log_error),
        factor=factor,
        percent=None if factor is None else factor - 1.0,
        worst_log_error=_finite(summary.worst),
        sigma=_finite(summary.sigma),
        coverage=summary.coverage,
    )


def verdict_public(verdict: Verdict) -> VerdictPublic:
    return VerdictPublic(
        level=verdict.level,
        advice=verdict.advice,
        models=verdict.models,
        curves=verdict.curves,
        points=verdict.points,
    )


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
