"""A stored profile read as predictor features: how much slicing to width d discards, per signal and
aggregated over the stream (docs/science.md, "Predicting before pruning").

Pure Python (no torch): the API answers predictions from stored profiles without the engine. A
profile holds, per residual signal, the eigenvalues of its uncentred second moment, the share of
each eigenvector in the energy of the normalised tokens (what a norm's readers see), and logit-lens
readings at the profiled widths (`workers.profiling`), and per block linear the share of its output
energy each unstructured mask rule would remove at the profiled sparsities. Every feature is 0 when
nothing is pruned and grows with the sparsity; the feature laws (`core.prediction.feature_laws`) map it to
ln PPL(s) - ln PPL0. Which features a method is predicted from: `METHOD_FEATURES`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from core.param_count import sliced_width

if TYPE_CHECKING:
    from core.tables import Profile

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
    full = len(signal.eigenvalues)
    known: dict[float, float] = {**{w: pick(m) for w, m in signal.lens.items()}, full: 0.0}
    value = _interpolated(known, width)
    if value is None:
        raise ValueError(
            f"width {width} is outside the profiled widths {sorted(signal.lens)}; profile that sparsity"
        )
    return value


def _interpolated(known: Mapping[float, float], at: float) -> float | None:
    """known[at], or linear between the nearest known points on either side; None outside them."""
    if at in known:
        return known[at]
    above = [x for x in known if x > at]
    below = [x for x in known if x < at]
    if not above or not below:
        return None
    hi, lo = min(above), max(below)
    t = (at - lo) / (hi - lo)
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


# ---------------------------------------------------------------------- intra-layer mask errors

MASK_RULES = ("wanda", "magnitude", "magnitude-row")
"""The unstructured mask rules a profile measures (`workers.profiling.mask_errors`): Wanda's per-row
|W| ||X||, one |W| threshold per layer, and |W| per row."""


@dataclass(frozen=True)
class LinearErrors:
    """One block linear of a profile: e(s) = the share of its output energy a rule's mask removes,
    at the profile's sparsities."""

    layer: int
    name: str
    output_energy: float
    errors: dict[str, tuple[float, ...]]  # rule -> e(s) at each of `sparsities`
    sparsities: tuple[float, ...]

    def error(self, rule: str, sparsity: float) -> float:
        """e(s): exact at a profiled sparsity, linear in s between two (0 at s = 0); ValueError above
        the largest profiled one or for a rule the profile did not measure."""
        if rule not in self.errors:
            raise ValueError(f"the profile has no {rule!r} mask errors; profile the model again")
        value = _interpolated(
            {0.0: 0.0, **dict(zip(self.sparsities, self.errors[rule], strict=True))}, sparsity
        )
        if value is None:
            raise ValueError(
                f"sparsity {sparsity:g} is outside the profiled sparsities {sorted(self.sparsities)}; "
                "profile that sparsity"
            )
        return value


@dataclass(frozen=True)
class MaskFeature:
    """An aggregate over the linears' e(s) of one mask rule, with why it is offered."""

    name: str
    description: str
    value: Callable[[Sequence[LinearErrors], Sequence[float]], float]  # (linears, their e(s)) -> F


def _depth_sum(linears: Sequence[LinearErrors], errors: Sequence[float]) -> float:
    """Sum of e over every linear, divided by the linears per block: the mean block's error times
    the depth, so that deeper models, whose errors compound over more blocks, score higher."""
    per_block = len(linears) / max(len({linear.layer for linear in linears}), 1)
    return math.fsum(errors) / per_block


def _energy_weighted(linears: Sequence[LinearErrors], errors: Sequence[float]) -> float:
    total = math.fsum(linear.output_energy for linear in linears)
    lost = math.fsum(linear.output_energy * e for linear, e in zip(linears, errors, strict=True))
    return lost / total if total > 0 else 0.0


MASK_FEATURES: dict[str, MaskFeature] = {
    feature.name: feature
    for feature in (
        MaskFeature(
            "output-error-mean",
            "mean over the block linears of the share of output energy the mask removes",
            lambda _linears, errors: _mean(errors),
        ),
        MaskFeature(
            "output-error-depth-sum",
            "the summed output-energy shares over the linears, per linear of a block: the mean block's "
            "error times the number of blocks it compounds over",
            _depth_sum,
        ),
        MaskFeature(
            "output-error-weighted",
            "output energy removed over all linears, over their total output energy (large outputs dominate)",
            _energy_weighted,
        ),
        MaskFeature(
            "output-error-max",
            "the linear that loses the largest share of its output energy",
            lambda _linears, errors: max(errors),
        ),
    )
}


def mask_feature_value(name: str, linears: Sequence[LinearErrors], rule: str, sparsity: float) -> float:
    """F_name at `sparsity` over the linears' e(s) of `rule`; KeyError for an unknown feature."""
    if not linears:
        raise ValueError("the profile has no mask errors; profile the model again")
    return MASK_FEATURES[name].value(linears, [linear.error(rule, sparsity) for linear in linears])


# ------------------------------------------------------------------------------ by method


@dataclass(frozen=True)
class MethodFeatures:
    """What a profile predicts one pruning method from: slicing's spectra and lens readings at the
    sliced width (`rule` None), or one mask rule's output errors at the sparsity."""

    method: str
    rule: str | None
    note: str

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(FEATURES if self.rule is None else MASK_FEATURES)

    def description(self, name: str) -> str:
        return (FEATURES[name] if self.rule is None else MASK_FEATURES[name]).description


METHOD_FEATURES: dict[str, MethodFeatures] = {
    entry.method: entry
    for entry in (
        MethodFeatures("slicegpt", None, "slicing's spectra and lens readings at the sliced width"),
        MethodFeatures("wanda", "wanda", "the output error of Wanda's masks on the dense inputs"),
        MethodFeatures(
            "sparsegpt",
            "wanda",
            "the output error of Wanda's masks on the dense inputs, a proxy: SparseGPT picks its own "
            "masks and its reconstruction only lowers the error; the law's coefficient absorbs the gap",
        ),
        MethodFeatures("magnitude", "magnitude", "the output error of one |W| threshold per layer"),
        MethodFeatures("magnitude-row", "magnitude-row", "the output error of a |W| threshold per row"),
    )
}
"""The stored methods a profile predicts (unstructured only: N:M patterns and drops are not profiled)."""


def sibling_methods(method: str) -> tuple[str, ...]:
    """The other methods predicted from the same features (every mask rule's methods share the mask
    aggregates; slicing has none): their coefficients can share a model effect
    (`core.prediction.cross_method`)."""
    entry = METHOD_FEATURES.get(method)
    if entry is None:
        return ()
    return tuple(
        other.method
        for other in METHOD_FEATURES.values()
        if other.method != method and other.names == entry.names
    )


@dataclass(frozen=True)
class StoredProfile:
    """A `profiles` row with its signals read as spectra and its linears' mask errors."""

    row: Profile
    signals: list[SignalSpectrum]
    linears: list[LinearErrors] = field(default_factory=list)

    @property
    def calibration(self) -> dict[str, Any]:
        calibration: dict[str, Any] = self.row.protocol.get("calibration", {})
        return calibration

    @property
    def round_to(self) -> int:
        return int(self.row.protocol.get("round_to", 8))

    def width(self, sparsity: float) -> int:
        return sliced_width(self.row.hidden_size, sparsity, self.round_to)

    def offers(self, method: str) -> bool:
        """Whether this profile predicts `method`: slicing needs a model slicing takes, the intra-layer
        methods need mask errors of their rule."""
        entry = METHOD_FEATURES.get(method)
        if entry is None:
            return False
        if entry.rule is None:
            return not self.row.protocol.get("slicing_refusal") and bool(self.signals)
        return self.offers_rule(entry.rule)

    def offers_rule(self, rule: str) -> bool:
        return any(rule in linear.errors for linear in self.linears)

    def feature(self, method: str, name: str, sparsity: float) -> float:
        """F_name for `method` at `sparsity` (slicing's: at the sliced width); ValueError outside the
        profiled range, or for a method the profile does not offer."""
        if not self.offers(method):
            raise ValueError(f"this profile does not predict {method}")
        rule = METHOD_FEATURES[method].rule
        if rule is None:
            return feature_value(name, self.signals, self.width(sparsity))
        return mask_feature_value(name, self.linears, rule, sparsity)
