"""What a profile measured (`workers.profiling.profile.profile_model`), in the shapes a job's rows
are built from: per residual signal its spectrum, energy shares and lens readings, and per block
linear each mask rule's output error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.profiles import signal_name
from workers.profiling.mask_errors import LinearError

DEFAULT_LENS_TOKENS = 256


class ProfileStopped(RuntimeError):
    """should_stop() asked to stop; nothing was changed."""


@dataclass(frozen=True)
class LensReading:
    """One signal at one kept width, read through the final norm and head (means over lens tokens)."""

    width: int
    kl: float  # KL(p || q) in nats, p dense, q from the projected signal
    kl_taylor: float  # Var_p(dz) / 2
    nll_increase: float  # mean of log p(next token) - log q(next token)


@dataclass(frozen=True)
class SignalProfile:
    """One residual signal: its spectrum and its lens readings."""

    index: int  # position in the stream: 0 the embedding output, then per block (pre-mlp,) output
    kind: str  # "embedding" | "pre-mlp" (between attention and MLP) | "output" (the block output)
    layer: int | None  # the block, None for the embedding output
    eigenvalues: list[float]  # of the calibration windows' C / positions, descending (slicing's basis)
    energy: list[float]  # share of each eigenvector in the measured windows' energy (sums to 1)
    token_energy: list[float]  # share of each eigenvector in the normalised tokens' energy (sums to 1)
    lens: list[LensReading]

    @property
    def name(self) -> str:
        return signal_name(self.layer, self.kind)


@dataclass
class ProfileReport:
    """What `profile_model` measured, for the job's rows."""

    family: str
    hidden_size: int
    num_layers: int
    sparsities: list[float]
    round_to: int
    widths: list[int]  # d per sparsity
    calibration_sequences: int
    calibration_tokens: int
    lens_tokens: int
    device: str
    dtype: str
    signals: list[SignalProfile]
    timings: dict[str, Any] = field(default_factory=dict)
    measured_tokens: int = 0  # positions the shares were measured on (the calibration's by default)
    linears: list[LinearError] = field(default_factory=list)  # per block linear, in block order
    mask_rules: list[str] = field(default_factory=list)
    slicing_refusal: str | None = None  # why slicing cannot prune this model (then no pre-MLP signals)
