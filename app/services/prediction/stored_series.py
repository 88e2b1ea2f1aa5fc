"""A measured series read from the store (`load_series`): which rows belong to it, and which stored
protocol it is when several match (docs/architecture.md, "Where each rung's answer comes from").

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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import bindparam, select

from app.services.prediction.series import PPL, Measured, Selector, Series, SeriesKey
from core.methods import DENSE
from core.store import Store
from core.tables import Result

MAX_ROWS = 5_000

"""Newest results read for one prediction: far more than any real series, a bound for odd stores."""


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
