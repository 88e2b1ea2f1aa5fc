"""Published pruning curves as data: results other people measured, with the protocol they were
measured under, stored as `source: published` (`prunecast import-published`).

They are kept apart from measured results everywhere a law is fitted to a model's points (the series
read `source = measured` only), and enter the store's curves (`GET /v1/backtests`) as their own
curves, labelled published, where they score the strict and calibrated laws. They carry no profile
(nobody ran the dense pass here), so they do not inform the feature laws.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.methods import DENSE
from core.prediction.fits import MeasuredPoint, ppl_fit
from core.tables import Fit, Result

PUBLISHED = "published"


@dataclass(frozen=True)
class PublishedCurve:
    """One published perplexity curve: dense first, then (sparsity, PPL) pairs."""

    model_id: str
    method: str
    dataset: str
    dense: float
    points: tuple[tuple[float, float], ...]
    reference: str
    protocol: dict[str, Any] = field(default_factory=dict)

    def full_protocol(self) -> dict[str, Any]:
        return {**self.protocol, "source": PUBLISHED, "reference": self.reference}


SLICEGPT_PROTOCOL: dict[str, Any] = {
    "seqlen": 2048,
    "max_windows": None,  # the whole WikiText-2 test split
    "dtype": "float16",
    "calibration": {"corpus": "wikitext2-train", "num_sequences": 128, "seqlen": 2048, "seed": None},
    "round_to": None,
    "slice_head": False,
}
SLICEGPT_REFERENCE = (
    "Ashkboos et al., SliceGPT (ICLR 2024), Table 1: WikiText-2 token perplexity, eval seqlen 2048, "
    "128 calibration samples of WikiText-2 train"
)

PUBLISHED_CURVES: tuple[PublishedCurve, ...] = (
    PublishedCurve(
        "facebook/opt-125m",
        "slicegpt",
        "wikitext2",
        27.64,
        ((0.1, 29.33), (0.2, 34.53), (0.25, 38.13), (0.3, 44.61)),
        SLICEGPT_REFERENCE,
        SLICEGPT_PROTOCOL,
    ),
    PublishedCurve(
        "meta-llama/Llama-2-7b-hf",
        "slicegpt",
        "wikitext2",
        5.47,
        ((0.1, 5.96), (0.2, 6.86), (0.25, 7.56), (0.3, 8.64)),
        SLICEGPT_REFERENCE,
        SLICEGPT_PROTOCOL,
    ),
)


def published_rows(curve: PublishedCurve) -> tuple[list[Result], Fit]:
    """The curve's results (`source: published`, no job) and its calibrated-law fit."""
    protocol = curve.full_protocol()

    def row(method: str, sparsity: float, value: float) -> Result:
        return Result(
            model_id=curve.model_id,
            method=method,
            sparsity=sparsity,
            metric="ppl",
            dataset=curve.dataset,
            split="test",
            protocol=protocol,
            value=value,
            source=PUBLISHED,
        )

    results = [row(DENSE, 0.0, curve.dense), *(row(curve.method, s, v) for s, v in curve.points)]
    fit = ppl_fit(
        model_id=curve.model_id,
        model_revision=None,
        method=curve.method,
        dataset=curve.dataset,
        protocol=protocol,
        dense=MeasuredPoint(0.0, curve.dense),
        points=[MeasuredPoint(s, v) for s, v in curve.points],
    )
    return results, fit


def import_published(session: Session) -> list[str]:
    """Add every published curve the store does not hold yet (by model, method and reference); the
    labels of those added."""
    added = []
    for curve in PUBLISHED_CURVES:
        held = session.scalar(
            select(Result.id).where(
                Result.source == PUBLISHED,
                Result.model_id == curve.model_id,
                Result.method == curve.method,
                Result.dataset == curve.dataset,
            )
        )
        if held is not None:
            continue
        results, fit = published_rows(curve)
        session.add_all([*results, fit])
        added.append(f"{curve.model_id} / {curve.method} ({curve.reference})")
    return added
