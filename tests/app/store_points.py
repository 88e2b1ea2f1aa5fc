"""Measured points written straight into the store, as evaluate / prune jobs would write them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from core.store import Store
from core.tables import Job, Result

# WikiText-2 token PPL, seqlen 2048, 128 calibration samples (SliceGPT, docs/science.md §1)
OPT_125M_DENSE = 27.64
OPT_125M_SLICED = {0.10: 29.33, 0.20: 34.53, 0.25: 38.13, 0.30: 44.61}


def ppl_protocol(seqlen: int = 2048, max_windows: int | None = 4, dtype: str = "float32") -> dict[str, Any]:
    return {
        "seqlen": seqlen,
        "requested_seqlen": seqlen,
        "max_windows": max_windows,
        "windows": max_windows or 147,
        "data_sha256": "0" * 64,
        "dtype": dtype,
        "calibration": {"num_sequences": 128, "note": "large nested records are never read"},
    }


def add_series(
    store: Store,
    model: str,
    dense: float | None,
    pruned: Sequence[tuple[float, float]],
    *,
    method: str = "slicegpt",
    metric: str = "ppl",
    dataset: str = "wikitext2",
    protocol: dict[str, Any] | None = None,
    job_id: str | None = None,
) -> list[int]:
    """Dense (method `dense`, sparsity 0) and pruned results; returns their ids in that order."""
    protocol = ppl_protocol() if protocol is None and metric == "ppl" else (protocol or {})
    rows = []
    if dense is not None:
        rows.append((DENSE_METHOD, 0.0, dense))
    rows += [(method, s, v) for s, v in pruned]
    results = [
        Result(
            job_id=job_id,
            model_id=model,
            method=m,
            sparsity=s,
            metric=metric,
            dataset=dataset,
            value=v,
            source="measured",
            protocol=protocol,
        )
        for m, s, v in rows
    ]
    with store.session() as session:
        session.add_all(results)
        session.flush()
        return [r.id for r in results]


DENSE_METHOD = "dense"


def add_job(
    store: Store, model: str, *, kind: str = "prune", status: str = "succeeded", **request: Any
) -> str:
    """A finished job row (no worker ran it), for reports."""
    job = Job(
        kind=kind,
        status=status,
        stage="done" if status == "succeeded" else status,
        progress=1.0 if status == "succeeded" else 0.0,
        request={"kind": kind, "model": model, **request},
        model_id=model,
        request_hash="0" * 64,
    )
    with store.session() as session:
        session.add(job)
        session.flush()
        return job.id
