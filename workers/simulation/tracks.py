"""What every simulation engine runs: tracks, one per simulated sparsity, over the evaluation windows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from core.prediction.anchoring import ANCHOR_ROLE, SIMULATED_ROLE
from workers.block_inputs import BlockBatch

ProgressCallback = Callable[[int, int], None]  # (blocks done, number of blocks)
StopCheck = Callable[[], bool]  # True asks the engine to stop before the next block

SIMULATED = SIMULATED_ROLE
"""A track of the cheap simulation (the face value)."""
ANCHOR = ANCHOR_ROLE
"""A track that runs the method itself (its own bases or statistics) through the same passes."""


@dataclass
class Track:
    """One sparsity's copy of the evaluation windows on its way through the blocks."""

    sparsity: float
    role: str  # SIMULATED | ANCHOR
    batches: list[BlockBatch] = field(default_factory=list)
