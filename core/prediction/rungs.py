"""The rungs an answer can come from, best first, and the choice of one answer among them.

- `measured`: the store (or the caller) has the point itself, under the asked protocol;
- `simulated`: a `simulate` job's curve (anchored through measured points when it has anchors);
- `profile`: a feature law on the model's dense profile;
- `law`: the calibrated law on the model's own pruned points, or a prior pooled over other models'
  curves when it has none.

A rung that cannot answer at a sparsity says why (`why_not`); the answer is the first rung, in this
order, with a finite value. The strict law is never a rung: it is shown for reference, and answers
only when a caller asks for it by name (`STRICT`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from core.prediction.records import Verdict


class Rung(StrEnum):
    MEASURED = "measured"
    SIMULATED = "simulated"
    PROFILE = "profile"
    LAW = "law"


RUNG_ORDER: tuple[Rung, ...] = (Rung.MEASURED, Rung.SIMULATED, Rung.PROFILE, Rung.LAW)
STRICT = "strict"
"""What a caller names to be answered by the strict law PPL0 ** (1 / (1 - s))."""
BEST = "best"
"""The default: the best rung that can answer."""


@dataclass(frozen=True)
class Estimate:
    """One rung's answer at one sparsity: its value and band, the predictor that gave it, what it
    rests on, and its verdict; `value` None with `why_not` where the rung cannot answer."""

    rung: Rung | str
    sparsity: float
    value: float | None
    band: tuple[float, float] | None
    predictor: str
    source: str
    verdict: Verdict
    why_not: str | None = None
    flags: tuple[str, ...] = field(default=())

    @property
    def answers(self) -> bool:
        return self.value is not None and math.isfinite(self.value)


def best(estimates: Sequence[Estimate], wanted: str = BEST) -> Estimate | None:
    """The answer: the estimate of the rung the caller named, else the first rung in `RUNG_ORDER`
    that answers; None when none does."""
    if wanted != BEST:
        return next((e for e in estimates if e.rung == wanted and e.answers), None)
    for rung in RUNG_ORDER:
        found = next((e for e in estimates if e.rung == rung and e.answers), None)
        if found is not None:
            return found
    return None
