"""What slicing reports: the widths it left every residual signal at, the parameters before and after,
the calibration it saw, its timings and, optionally, the kept directions of every signal.

Both layouts (`workers.slicing.engine`, per layer; `workers.slicing.stock`, one shared basis) return a
`SlicingReport`; the job stores `to_dict()` in its result's protocol, the artifact writes it into
slicing_config.json (`workers.slicing.artifacts`), and a loader rebuilds the sliced shapes from
`SlicedWidths`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from core.methods import PER_LAYER_LAYOUT


@dataclass(frozen=True)
class BlockWidths:
    """Residual widths around one block after slicing."""

    attn_in: int  # stream entering the block (read by the attention norm)
    mlp_in: int  # stream the MLP reads: between attention and MLP (the block input if parallel)
    out: int  # stream leaving the block


@dataclass(frozen=True)
class SlicedWidths:
    """d per signal: what a loader needs to rebuild the sliced shapes."""

    full: int  # D of the dense model (also the constant in every RMSNormNoScale)
    embedding: int  # columns kept by the embeddings (and learned positions)
    blocks: tuple[BlockWidths, ...]
    head: int  # input columns of the LM head

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SlicedWidths:
        return cls(
            full=int(data["full"]),
            embedding=int(data["embedding"]),
            blocks=tuple(BlockWidths(**block) for block in data["blocks"]),
            head=int(data["head"]),
        )

    @classmethod
    def uniform(cls, full: int, width: int, num_blocks: int, slice_head: bool) -> SlicedWidths:
        """Every signal at d, except the last block's output and the head at D unless slice_head."""
        last = width if slice_head else full
        blocks = tuple(
            BlockWidths(attn_in=width, mlp_in=width, out=last if index == num_blocks - 1 else width)
            for index in range(num_blocks)
        )
        return cls(full=full, embedding=width, blocks=blocks, head=last)


@dataclass
class SlicingReport:
    """What slicing did, for the job's results and the artifact's slicing_config.json."""

    family: str
    hidden_size: int  # D
    sparsity: float  # fraction of the residual width removed (not of parameters)
    round_to: int
    slice_head: bool
    widths: SlicedWidths
    params_before: int  # unique parameters of the dense model (a tied head counted once)
    params_after: int
    predicted_params_before: int | None  # from the config formula (core.param_count)
    predicted_params_after: int | None
    calibration_sequences: int
    calibration_tokens: int  # non-padded positions the PCAs saw
    device: str
    dtype: str
    timings: dict[str, Any] = field(default_factory=dict)  # seconds: capture, blocks (list), head, total
    layout: str = PER_LAYER_LAYOUT  # core.methods layouts: per-layer (engine.py) or stock (stock.py)
    pooling: str | None = None  # stock layout: how the signals were pooled into the one basis
    # The kept directions of every block-boundary signal, (D, d_k) float32 on the CPU: k = 0 is what
    # block 0 reads (the embedding output), k = i + 1 what block i writes. A dense stream x maps
    # into the sliced model's signal k as x @ B_k, and back as x_k @ B_k^T (probes use both).
    bases: list[torch.Tensor] | None = field(default=None, repr=False, compare=False)

    @property
    def width(self) -> int:
        """d, the kept width of the residual stream."""
        return self.widths.embedding

    @property
    def param_fraction_removed(self) -> float:
        """1 - after / before: the real parameter saving (may be negative for tied small models)."""
        return 1.0 - self.params_after / self.params_before

    def to_dict(self) -> dict[str, Any]:
        data = asdict(replace(self, bases=None))
        data.pop("bases")
        data["width"] = self.width
        data["param_fraction_removed"] = self.param_fraction_removed
        return data


def kept_directions(basis: torch.Tensor, keep: int) -> torch.Tensor:
    """Q[:, :keep] as float32 on the CPU, what `SlicingReport.bases` holds."""
    return basis[:, :keep].to(device="cpu", dtype=torch.float32).contiguous()
