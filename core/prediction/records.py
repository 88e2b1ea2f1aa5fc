"""Honest records: how far a predictor's answers landed from measured points it did not see.

A miss is scored by |ln(predicted / measured)|: 2x too high and 2x too low are equally wrong, which a
relative error is not (20x too high is 1,900 %, 20x too low 95 %). Records pool model -> curve ->
point: each model counts once, however many calibrations or protocols it was measured under, so three
curves of one model do not pass for evidence about three models. A model with no pruned point of its
own is judged only on a record over other models (`MIN_MODELS_NEW`), never on a within-model one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar

RELIABLE_FACTOR = 1.15
"""A typical miss of at most 15 % either way (|ln| <= ln 1.15) is reliable: the error the product
promises for a model with no pruned point. Fixed before any curve was scored."""
ROUGH_FACTOR = 1.5
"""Up to 1.5x either way a prediction is a direction and a range; beyond it, not even the size."""
MIN_POINTS = 3
"""Fewer held-out points than this are no record."""
MIN_MODELS_NEW = 2
"""A verdict for a model the store has not measured rests on misses of at least this many models."""

VerdictLevel = Literal["measured", "exact", "reliable", "rough", "unreliable", "unscored"]


class Missed(Protocol):
    """A held-out point: whose it was and how far the prediction landed (|ln| error)."""

    @property
    def model(self) -> str: ...

    @property
    def curve(self) -> str: ...

    @property
    def log_error(self) -> float: ...


def log_error(predicted: float, measured: float) -> float:
    """|ln(predicted / measured)|; infinite for a prediction that overflowed or is not positive."""
    if not (measured > 0.0 and math.isfinite(measured)):
        raise ValueError(f"a measured value must be finite and > 0, got {measured}")
    if not (predicted > 0.0 and math.isfinite(predicted)):
        return math.inf
    return abs(math.log(predicted / measured))


M = TypeVar("M", bound=Missed)


def pooled_mean(misses: Iterable[M], value: Callable[[M], float]) -> float | None:
    """Mean over models of the mean over their curves of the mean over each curve's points."""
    grouped: dict[str, dict[str, list[float]]] = {}
    for miss in misses:
        grouped.setdefault(miss.model, {}).setdefault(miss.curve, []).append(value(miss))
    if not grouped:
        return None
    per_model = [
        math.fsum(math.fsum(points) / len(points) for points in curves.values()) / len(curves)
        for curves in grouped.values()
    ]
    return math.fsum(per_model) / len(per_model)


def choose(candidates: Mapping[str, Sequence[M]], exclude_model: str | None = None) -> str | None:
    """The candidate with the lowest pooled |ln| miss over the points of models other than
    `exclude_model`; None when no candidate has `MIN_POINTS` such points."""
    scored = []
    for name, misses in candidates.items():
        kept = [m for m in misses if m.model != exclude_model]
        mean = pooled_mean(kept, lambda m: m.log_error) if len(kept) >= MIN_POINTS else None
        if mean is not None:
            scored.append((mean, name))
    return min(scored)[1] if scored else None


def nested(candidates: Mapping[str, Sequence[M]]) -> list[M]:
    """The record of choosing among `candidates` by `choose`: each model's points are taken from the
    candidate chosen without that model, so the choice never sees the points that then judge it."""
    models = sorted({m.model for misses in candidates.values() for m in misses})
    record: list[M] = []
    for model in models:
        chosen = choose(candidates, exclude_model=model)
        if chosen is not None:
            record += [m for m in candidates[chosen] if m.model == model]
    return record


class DistanceMissed(Missed, Protocol):
    """A held-out point of a one-point law, with its distance from the point the law was fitted on."""

    @property
    def distance(self) -> float | None: ...


def distance_rate(misses: Sequence[DistanceMissed]) -> float | None:
    """tau of a one-point band's sd = tau |s - s_point|: the misses' |ln| error per unit of distance
    from the point they were fitted on, as a root mean square pooled model -> curve; None under
    `MIN_POINTS` usable misses."""
    usable = [m for m in misses if m.distance and math.isfinite(m.log_error)]
    if len(usable) < MIN_POINTS:
        return None
    square = pooled_mean(usable, lambda m: (m.log_error / (m.distance or math.inf)) ** 2)
    return None if square is None else math.sqrt(square)


@dataclass(frozen=True)
class Summary:
    """A record in numbers: typical (pooled mean) and worst |ln| miss, the pooled RMS a band uses,
    and what it rests on."""

    points: int
    curves: int
    models: int
    log_error: float | None
    worst: float | None
    sigma: float | None
    coverage: float | None

    @property
    def factor(self) -> float | None:
        """The typical miss as a factor (1.2: 20 % either way)."""
        return None if self.log_error is None else _exp(self.log_error)

    def describe(self) -> str:
        if self.log_error is None or self.worst is None:
            return "no held-out point"
        covered = "" if self.coverage is None else f", band coverage {self.coverage:.0%}"
        return (
            f"typical miss x{_exp(self.log_error):.3g} ({_exp(self.log_error) - 1:.0%}), worst "
            f"x{_exp(self.worst):.3g}, over {self.points} held-out point(s) of {self.curves} curve(s) "
            f"of {self.models} model(s){covered}"
        )


def summarize(misses: Sequence[Missed], covered: Sequence[bool | None] = ()) -> Summary:
    """The pooled numbers of a set of misses (`covered`: whether each stated band held its truth)."""
    flags = [c for c in covered if c is not None]
    mean = pooled_mean(misses, lambda m: m.log_error)
    square = pooled_mean(misses, lambda m: m.log_error**2)
    return Summary(
        points=len(misses),
        curves=len({(m.model, m.curve) for m in misses}),
        models=len({m.model for m in misses}),
        log_error=mean,
        worst=max((m.log_error for m in misses), default=None),
        sigma=None if square is None else math.sqrt(square),
        coverage=sum(flags) / len(flags) if flags else None,
    )


@dataclass(frozen=True)
class Verdict:
    """How far an answer can be trusted, and the record that says so."""

    level: VerdictLevel
    advice: str
    models: int = 0
    curves: int = 0
    points: int = 0


def verdict(summary: Summary | None, *, new_model: bool, what: str = "backtest") -> Verdict:
    """The verdict a record earns by fixed thresholds on its typical miss (`RELIABLE_FACTOR`,
    `ROUGH_FACTOR`); unscored below `MIN_POINTS` points, or, for a model the store has not measured,
    below `MIN_MODELS_NEW` models."""
    if summary is None or summary.log_error is None or summary.points < MIN_POINTS:
        return Verdict("unscored", f"no {what} record yet: measure a curve of this method to score it")
    counts = {"models": summary.models, "curves": summary.curves, "points": summary.points}
    record = f"{what}: {summary.describe()}"
    if new_model and summary.models < MIN_MODELS_NEW:
        return Verdict(
            "unscored",
            f"{record}; a model nobody has measured is judged only on a record over at least "
            f"{MIN_MODELS_NEW} models",
            **counts,
        )
    if summary.log_error <= math.log(RELIABLE_FACTOR):
        return Verdict("reliable", record, **counts)
    if summary.log_error <= math.log(ROUGH_FACTOR):
        return Verdict("rough", f"{record}: read it as a direction and a range, not a number", **counts)
    return Verdict(
        "unreliable",
        f"{record}: not even the right size; measure the sparsity you need (a sweep or a prune job)",
        **counts,
    )


def _exp(value: float) -> float:
    try:
        return math.exp(value)
    except OverflowError:
        return math.inf
