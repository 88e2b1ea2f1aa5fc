"""A dense baseline's windows scored in another dtype, kept in the store (`core.tables.DenseWindow`).

A simulation's bfloat16 windows are each corrected by the dense model's own bfloat16 value on that
window (`workers.simulation.cheap_windows`). That value depends only on the baseline (model and
protocol), the dtype and the kind of device that computed it, so it is scored once and every later
simulation of the model under that protocol reuses it: on SmolLM2-135M those windows were about a
tenth of a SliceGPT curve to the default precision (bench/README.md, `precision_curves.py`).

The key `scored_on` names the dtype, the device (its name on CUDA; the CPU's vector capability, which
decides the bfloat16 kernels) and the torch version: a value from other kernels would be a different
correction, so it is not reused.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from core.tables import DenseWindow


def scored_on(dtype: torch.dtype, device: torch.device) -> str:
    """The key of values scored in `dtype` on `device` with this torch."""
    if device.type == "cuda":
        where = f"cuda ({torch.cuda.get_device_name(device)})"
    elif device.type == "cpu":
        where = f"cpu ({torch.backends.cpu.get_cpu_capability()})"
    else:
        where = device.type
    return f"{str(dtype).removeprefix('torch.')} on {where}, torch {torch.__version__}"


def stored_dense_windows(session: Session, result_id: int, key: str) -> dict[int, float]:
    """Every window of the dense result `result_id` already scored under `key`: index -> mean NLL."""
    rows = session.execute(
        select(DenseWindow.window_index, DenseWindow.nll).where(
            DenseWindow.result_id == result_id, DenseWindow.scored_on == key
        )
    )
    return {window: nll for window, nll in rows}


def store_dense_windows(session: Session, result_id: int, key: str, values: Mapping[int, float]) -> None:
    """Keep `values` (index -> mean NLL) for the dense result `result_id` under `key`; a window another
    job stored meanwhile keeps its value (it is the same computation)."""
    if not values:
        return
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    rows = [
        {"result_id": result_id, "scored_on": key, "window_index": w, "nll": v} for w, v in values.items()
    ]
    statement = insert(DenseWindow).values(rows)
    session.execute(
        statement.on_conflict_do_nothing(index_elements=["result_id", "scored_on", "window_index"])
    )
