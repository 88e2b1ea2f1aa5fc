"""A stored profile read as predictor features: how much slicing to width d discards, per signal and
aggregated over the stream (docs/science.md, "Predicting before pruning").

Pure Python (no torch): the API answers predictions from stored profiles without the engine. A
profile holds, per residual signal, the eigenvalues of its uncentred second moment, the share of
each eigenvector in the energy of the normalised tokens (what a norm's readers see), and logit-lens
readings at the profiled widths (`workers.profiling`). Every feature F(d) is 0 at d = D and grows
as d shrinks; the feature laws (`core.feature_laws`) map it to ln PPL(s) - ln PPL0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

CALIBRATION_KEYS = ("corpus", "data_sha256", "seed", "num_sequences", "seqlen")
"""Calibration record keys that identify the windows: a profile predicts the prunings (sweep points,
fits) whose calibration agrees with its own on all of them."""


def signal_name(layer: int | None, kind: str) -> str:
    """How a signal is named: "embedding", or e.g. "block 3 pre-mlp" / "block 3 output"."""
    return "embedding" if layer is None else f"block {layer} {kind}"


@dataclass(frozen=True)
class LensMeans:
    """One signal at one width read through the final norm and head: means over the lens tokens."""

    kl: float
    kl_taylor: float
    nll_increase: float


@dataclass(frozen=True)
class SignalSpectrum:
    """One residual signal of a profile."""

    index: int
    kind: str  # "embedding" | "pre-mlp" | "output"
    layer: int | None
    eigenvalues: tuple[float, ...]  # of the calibration windows, descending: slicing's basis
    token_energy: tuple[float, ...]  # per eigenvector, sums to 1
    lens: dict[int, LensMeans] = field(default_factory=dict)  # width -> readings
    energy: tuple[float, ...] = ()  # per eigenvector, sums to 1, on the measured windows; () = eigenvalues

    @property
    def name(self) -> str:
        return signal_name(self.layer, self.kind)

    def discarded(self, width: int) -> float:
        """Share of the raw energy outside the top-`width` eigenvectors, on the windows the profile
        was measured on (in-sample: 1 - sum(top d eigenvalues) / sum(all))."""
        return _tail_share(self.energy or self.eigenvalues, width)

    def token_discarded(self, width: int) -> float:
        """Mean share of each normalised token's energy outside the top-`width` eigenvectors."""
        return _tail_share(self.token_energy, width)


def _tail_share(values: Sequence[float], width: int) -> float:
    if width < 0:
        raise ValueError(f"width must be >= 0, got {width}")
    total = math.fsum(values)
    if total <= 0.0:
        return 0.0
    return max(0.0, math.fsum(values[width:]) / total)


@dataclass(frozen=True)
class Feature:
    """An aggregate over the signals of a profile at width d, with why it is offered."""

    name: str
    description: str
    value: Callable[[Sequence[SignalSpectrum], int], float]
    needs_lens: bool = False


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else 0.0


def _weighted(signals: Sequence[SignalSpectrum], width: int) -> float:
    """Each signal's discarded share weighted by its total energy."""
    totals = [math.fsum(s.eigenvalues) for s in signals]
    total = math.fsum(totals)
    lost = math.fsum(t * s.discarded(width) for t, s in zip(totals, signals, strict=True))
    return lost / total if total > 0 else 0.0


def lens_value(signal: SignalSpectrum, width: int, pick: Callable[[LensMeans], float]) -> float:
    """A lens reading at `width`: exact at a profiled width, linear in d between two profiled
    widths, 0 at d = D (nothing projected away); ValueError outside the profiled range."""
    if width in signal.lens:
        return pick(signal.lens[width])
    full = len(signal.eigenvalues)
    known = {**{w: pick(m) for w, m in signal.lens.items()}, full: 0.0}
    above = [w for w in known if w > width]
    below = [w for w in known if w < width]
    if not above or not below:
        raise ValueError(
            f"width {width} is outside the profiled widths {sorted(signal.lens)}; profile that sparsity"
        )
    hi, lo = min(above), max(below)
    t = (width - lo) / (hi - lo)
    return known[lo] + t * (known[hi] - known[lo])


def _lens_sum(pick: Callable[[LensMeans], float]) -> Callable[[Sequence[SignalSpectrum], int], float]:
    return lambda signals, width: math.fsum(lens_value(s, width, pick) for s in signals)


FEATURES: dict[str, Feature] = {
    feature.name: feature
    for feature in (
        Feature(
            "energy-mean",
            "mean over signals of the raw energy share slicing discards",
            lambda signals, width: _mean([s.discarded(width) for s in signals]),
        ),
        Feature(
            "energy-weighted",
            "discarded raw energy of all signals over their total energy (late, large signals dominate)",
            _weighted,
        ),
        Feature(
            "energy-max",
            "the signal that loses the largest raw energy share",
            lambda signals, width: max(s.discarded(width) for s in signals),
        ),
        Feature(
            "token-energy-mean",
            "mean over signals of the share of each normalised token's energy discarded: what the "
            "norms hand to the linears, where a massive-activation direction no longer hides the rest",
            lambda signals, width: _mean([s.token_discarded(width) for s in signals]),
        ),
        Feature(
            "token-energy-max",
            "the signal whose normalised tokens lose the largest share",
            lambda signals, width: max(s.token_discarded(width) for s in signals),
        ),
        Feature(
            "lens-kl-sum",
            "sum over signals of KL(p || q) when that one signal is projected on its top-d eigenvectors "
            "and read through the final norm and head (the local counterfactual, summed over layers)",
            _lens_sum(lambda m: m.kl),
            needs_lens=True,
        ),
        Feature(
            "lens-taylor-sum",
            "the same sum with each KL replaced by its Taylor estimate Var_p(dz) / 2",
            _lens_sum(lambda m: m.kl_taylor),
            needs_lens=True,
        ),
        Feature(
            "lens-kl-final",
            "KL(p || q) of the last signal alone: what the head reads when it is sliced",
            lambda signals, width: lens_value(signals[-1], width, lambda m: m.kl),
            needs_lens=True,
        ),
    )
}
UNCALIBRATED_FEATURE = "lens-kl-sum"
"""The feature whose law needs no coefficient: its value is a predicted NLL increase in nats, taken
at face value (coefficient 1) when nothing was measured."""


def feature_value(name: str, signals: Sequence[SignalSpectrum], width: int) -> float:
    """F_name(d) over `signals`; KeyError for an unknown feature."""
    if not signals:
        raise ValueError("the profile has no signals")
    return FEATURES[name].value(signals, width)
