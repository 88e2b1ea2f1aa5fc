"""Measured series, from the store or from the caller: what every law is fitted to and every rung
reads.

A *series* is the dense baseline and the pruned points of one model, method, metric and protocol.
This module says what one is and builds it from a caller's points (`caller_series`); reading one from
the store is `app.services.prediction.stored_series`, and the accuracy prior pooled over the store's
other series is `app.services.prediction.accuracy_prior`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from app.schemas.predictions import (
    PointPublic,
    ProtocolPublic,
)

PPL = "ppl"


UNKNOWN_CHANCE_OPTIONS = 1_000_000

"""n_options passed to the accuracy law when the chance level is unknown: effectively no floor."""


SeriesKey = tuple[str, str | None]

"""(metric, task): task is None for perplexity."""


class SeriesError(ValueError):
    """The points cannot be fitted (e.g. a perplexity <= 1); the message says which and why."""


def finite(value: float | None) -> float | None:
    """JSON has no infinity or NaN: such values travel as null (and the caller adds a flag)."""
    return value if value is not None and math.isfinite(value) else None


@dataclass(frozen=True)
class Measured:
    """A measured value; ``result_id`` when it came from the store."""

    sparsity: float
    value: float
    result_id: int | None = None

    @property
    def as_tuple(self) -> tuple[float, float]:
        return (self.sparsity, self.value)

    def public(self) -> PointPublic:
        return PointPublic(sparsity=self.sparsity, value=self.value, result_id=self.result_id)


@dataclass(frozen=True)
class Selector:
    """Which perplexity protocol to use; None matches any stored value, ``all`` means every window."""

    dataset: str = "wikitext2"
    seqlen: int | None = None
    max_windows: int | Literal["all"] | None = None
    dtype: str | None = None
    source: Literal["measured", "published"] = "measured"  # published points never join measured ones

    def matches(self, seqlen: int | None, max_windows: int | None, dtype: str | None) -> bool:
        if self.seqlen is not None and seqlen != self.seqlen:
            return False
        if self.max_windows == "all" and max_windows is not None:
            return False
        if isinstance(self.max_windows, int) and max_windows != self.max_windows:
            return False
        return self.dtype is None or dtype == self.dtype

    @property
    def exact(self) -> bool:
        return self.seqlen is not None and self.max_windows is not None

    @property
    def windows(self) -> int | None:
        """max_windows as an evaluate job takes it (None: all)."""
        return self.max_windows if isinstance(self.max_windows, int) else None

    def describe(self) -> str:
        parts = [f"dataset={self.dataset}"]
        if self.seqlen is not None:
            parts.append(f"seqlen={self.seqlen}")
        if self.max_windows is not None:
            parts.append(f"max_windows={self.max_windows}")
        if self.dtype is not None:
            parts.append(f"dtype={self.dtype}")
        return ", ".join(parts)


@dataclass(frozen=True)
class Series:
    """The dense baseline and pruned points of one model, method, metric (and task) and protocol."""

    model: str
    method: str
    metric: str
    task: str | None
    dataset: str
    source: Literal["store", "caller"]
    selection: str
    dense: Measured | None
    pruned: tuple[Measured, ...] = ()
    seqlen: int | None = None
    max_windows: int | None = None
    dtype: str | None = None
    chance: float | None = None
    notes: tuple[str, ...] = ()

    @property
    def key(self) -> SeriesKey:
        return (self.metric, self.task)

    def protocol(self) -> ProtocolPublic:
        return ProtocolPublic(
            dataset=self.dataset,
            seqlen=self.seqlen,
            max_windows=self.max_windows,
            dtype=self.dtype,
            chance=self.chance,
            selection=self.selection,
        )

    @property
    def pruned_by_sparsity(self) -> list[Measured]:
        return sorted(self.pruned, key=lambda p: p.sparsity)

    def measured(self) -> list[PointPublic]:
        """Dense first, then pruned points by sparsity."""
        points = [self.dense] if self.dense else []
        return [p.public() for p in [*points, *self.pruned_by_sparsity]]


def n_options_for(chance: float | None) -> int:
    """The accuracy law takes a number of options; chance levels averaged over questions round."""
    if chance is None:
        return UNKNOWN_CHANCE_OPTIONS
    return max(2, round(1.0 / chance))


def caller_series(
    model: str,
    method: str,
    metric: str,
    task: str | None,
    dataset: str,
    points: Iterable[tuple[float, float, int | None, float | None]],
) -> Series:
    """A series from points a caller sent: (sparsity, value, n_options, chance) each."""
    dense: list[Measured] = []
    pruned: list[Measured] = []
    chances: set[float] = set()
    for sparsity, value, n_options, chance in points:
        (dense if sparsity == 0.0 else pruned).append(Measured(sparsity, value))
        if chance is not None:
            chances.add(round(chance, 9))
        if n_options is not None:
            chances.add(round(1.0 / n_options, 9))
    what = metric if task is None else f"{metric} of task {task}"
    if len(dense) > 1:
        raise SeriesError(f"points hold {len(dense)} dense values (sparsity 0) for {what}; send one")
    repeated = sorted({p.sparsity for p in pruned if sum(q.sparsity == p.sparsity for q in pruned) > 1})
    if repeated:
        raise SeriesError(
            f"points hold several values at sparsity {', '.join(f'{r:g}' for r in repeated)} for {what}; "
            "send one per sparsity (their mean, if they are repeats)"
        )
    if len(chances) > 1:
        raise SeriesError(f"points give different chance levels for {what}: {sorted(chances)}")
    if metric != PPL and not chances:
        notes: tuple[str, ...] = (
            "no chance level given (`n_options` or `chance`): predictions are not clipped",
        )
    else:
        notes = ()
    return Series(
        model=model,
        method=method,
        metric=metric,
        task=task,
        dataset=dataset,
        source="caller",
        selection="your points",
        dense=dense[0] if dense else None,
        pruned=tuple(pruned),
        chance=next(iter(chances)) if chances else None,
        notes=notes,
    )
