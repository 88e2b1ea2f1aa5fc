"""Measured series, from the store or from the caller: what every law is fitted to and every rung
reads.

A *series* is the dense baseline and the pruned points of one model, method, metric and protocol.
Perplexity protocols are told apart by the stored protocol's `seqlen`, `max_windows` and `dtype` (on
one dataset); an accuracy series is one task (the result's `dataset`) and metric, its chance level
read from the protocol's `chance` (or `n_options`). Of repeated measurements at one sparsity the
newest is used.

Reads are one query on the (model_id, method, metric) index that selects the few protocol keys it
needs, never the whole protocol JSON (a prune result's holds its calibration record and timings),
through ``Store.read``: one round trip to the store.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy import bindparam, select

from app.schemas.predictions import (
    PointPublic,
    ProtocolPublic,
)
from core.methods import DENSE
from core.prediction.laws import (
    PriorSlope,
    calibrate_acc,
    pool_slopes,
)
from core.store import Store
from core.tables import Result

PPL = "ppl"


MAX_ROWS = 5_000

"""Newest results read for one prediction: far more than any real series, a bound for odd stores."""


MAX_PRIOR_ROWS = 20_000

"""Newest results read to pool an accuracy prior over other models and tasks."""


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


def _int(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def _float(value: Any) -> float | None:
    try:
        number = None if value is None else float(value)
    except (TypeError, ValueError):
        return None
    return number if number is not None and math.isfinite(number) else None


def _chance(chance: Any, n_options: Any) -> float | None:
    value = _float(chance)
    if value is not None and 0.0 < value < 1.0:
        return value
    options = _int(n_options)
    return 1.0 / options if options is not None and options >= 2 else None


_COLUMNS = (
    Result.id,
    Result.method,
    Result.sparsity,
    Result.metric,
    Result.dataset,
    Result.value,
    Result.protocol["seqlen"].as_string().label("seqlen"),
    Result.protocol["max_windows"].as_string().label("max_windows"),
    Result.protocol["dtype"].as_string().label("dtype"),
    Result.protocol["chance"].as_string().label("chance"),
    Result.protocol["n_options"].as_string().label("n_options"),
)


_SERIES_QUERY = (
    select(*_COLUMNS)
    .where(
        Result.model_id == bindparam("model"),
        Result.method.in_([bindparam("dense"), bindparam("method")]),
        Result.source == bindparam("source"),
    )
    .order_by(Result.id.desc())
    .limit(MAX_ROWS)
)


@dataclass
class _Group:
    """Rows of one protocol, read newest first."""

    dense: Measured | None = None
    pruned: dict[float, Measured] = field(default_factory=dict)
    newest: int = 0
    chance: float | None = None

    def add(self, row: Any, method: str) -> None:
        self.newest = max(self.newest, row.id)
        point = Measured(float(row.sparsity), float(row.value), int(row.id))
        if row.method == DENSE:
            self.dense = self.dense or point
        elif row.method == method and point.sparsity > 0.0:
            self.pruned.setdefault(round(point.sparsity, 6), point)
        if self.chance is None:
            self.chance = _chance(row.chance, row.n_options)

    @property
    def size(self) -> int:
        return len(self.pruned) + (self.dense is not None)


def load_series(
    store: Store, model: str, method: str, wanted: Sequence[SeriesKey], selector: Selector
) -> dict[SeriesKey, Series]:
    """One series per wanted (metric, task), from one query; a series may lack its dense point."""
    wanted_rows = {(metric, selector.dataset if metric == PPL else str(task)) for metric, task in wanted}
    ppl_groups: dict[tuple[int | None, int | None, str | None], _Group] = {}
    acc_groups: dict[SeriesKey, _Group] = {}
    parameters = {"model": model, "dense": DENSE, "method": method, "source": selector.source}
    for row in store.read(_SERIES_QUERY, parameters):
        if (row.metric, row.dataset) not in wanted_rows:
            continue  # other metrics of the model: a few rows, cheaper than a query built per request
        if row.metric == PPL:
            key = (_int(row.seqlen), _int(row.max_windows), None if row.dtype is None else str(row.dtype))
            ppl_groups.setdefault(key, _Group()).add(row, method)
        else:
            acc_groups.setdefault((row.metric, row.dataset), _Group()).add(row, method)
    out: dict[SeriesKey, Series] = {}
    for metric, task in wanted:
        if metric == PPL:
            out[(metric, task)] = _choose_protocol(model, method, selector, ppl_groups)
        else:
            group = acc_groups.get((metric, str(task)), _Group())
            notes = () if group.chance is not None or group.dense is None else (_NO_CHANCE,)
            out[(metric, task)] = Series(
                model=model,
                method=method,
                metric=metric,
                task=task,
                dataset=str(task),
                source="store",
                selection=f"stored {metric} results of task {task}",
                dense=group.dense,
                pruned=tuple(group.pruned.values()),
                chance=group.chance,
                notes=notes,
            )
    return out


_NO_CHANCE = "the stored results record no chance level (protocol `chance`): predictions are not clipped"


def _choose_protocol(
    model: str,
    method: str,
    selector: Selector,
    groups: dict[tuple[int | None, int | None, str | None], _Group],
) -> Series:
    matching = {key: group for key, group in groups.items() if selector.matches(*key)}
    with_dense = {key: group for key, group in matching.items() if group.dense is not None}
    pool = with_dense or matching
    if not pool:
        return Series(
            model=model,
            method=method,
            metric=PPL,
            task=None,
            dataset=selector.dataset,
            source="store",
            selection=f"no stored perplexity matches {selector.describe()}",
            dense=None,
            seqlen=selector.seqlen,
            max_windows=selector.windows,
            dtype=selector.dtype,
        )
    key = max(pool, key=lambda k: (pool[k].size, pool[k].newest))
    group = pool[key]
    seqlen, max_windows, dtype = key
    described = f"seqlen={seqlen}, max_windows={'all' if max_windows is None else max_windows}, dtype={dtype}"
    if selector.exact:
        selection = f"exact match: {described}"
    else:
        selection = (
            f"{described}: the stored protocol with the most points of the {len(pool)} matching "
            f"{selector.describe()}"
        )
    others = [
        f"seqlen={k[0]}, max_windows={'all' if k[1] is None else k[1]}, dtype={k[2]} ({g.size} points)"
        for k, g in sorted(groups.items(), key=lambda item: -item[1].size)
        if k != key
    ]
    notes = (f"also stored under other protocols (not mixed in): {'; '.join(others[:3])}",) if others else ()
    return Series(
        model=model,
        method=method,
        metric=PPL,
        task=None,
        dataset=selector.dataset,
        source="store",
        selection=selection,
        dense=group.dense,
        pruned=tuple(group.pruned.values()),
        seqlen=seqlen,
        max_windows=max_windows,
        dtype=dtype,
        notes=notes,
    )


def pooled_accuracy_prior(
    store: Store, method: str, metric: str, exclude: tuple[str, str]
) -> PriorSlope | None:
    """The accuracy slope k pooled over every other (model, task) with a dense and a pruned point of
    this method and metric in the store; None when there is none (the law's default prior then)."""
    query = (
        select(
            Result.id,
            Result.model_id,
            Result.dataset,
            Result.method,
            Result.sparsity,
            Result.value,
            Result.protocol["chance"].as_string().label("chance"),
            Result.protocol["n_options"].as_string().label("n_options"),
        )
        .where(Result.metric == metric, Result.method.in_((DENSE, method)), Result.source == "measured")
        .order_by(Result.id.desc())
        .limit(MAX_PRIOR_ROWS)
    )
    groups: dict[tuple[str, str], tuple[list[Measured], dict[float, Measured], list[float]]] = {}
    for row in store.read(query):
        if (row.model_id, row.dataset) == exclude:
            continue
        dense, pruned, chances = groups.setdefault((row.model_id, row.dataset), ([], {}, []))
        point = Measured(float(row.sparsity), float(row.value), int(row.id))
        if row.method == DENSE:
            dense.append(point)
        elif point.sparsity > 0.0:
            pruned.setdefault(round(point.sparsity, 6), point)
        chance = _chance(row.chance, row.n_options)
        if chance is not None:
            chances.append(chance)
    slopes: list[float] = []
    names: list[str] = []
    for (model, task), (dense, pruned, chances) in sorted(groups.items()):
        slope = _fitted_slope(dense, pruned, chances)
        if slope is not None:
            slopes.append(slope)
            names.append(f"{model}/{task}")
    if not slopes:
        return None
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return pool_slopes(slopes, f"{metric} after {method} in this store ({shown})")


def _fitted_slope(dense: list[Measured], pruned: dict[float, Measured], chances: list[float]) -> float | None:
    """The accuracy slope k one model and task's own points give, or None (no pruned point, unfittable,
    or only the default prior)."""
    if not dense or not pruned:
        return None
    try:
        calibration = calibrate_acc(
            dense[0].value,
            [(p.sparsity, p.value) for p in pruned.values()],
            n_options_for(chances[0] if chances else None),
        )
    except (ValueError, OverflowError, ZeroDivisionError):
        return None
    if "prior" in calibration.flags:
        return None
    return float(calibration.candidates[0].params["k"])


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
