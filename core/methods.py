"""The pruning methods, one registry entry each: what a method is, needs, saves and is stored as.

Both sides dispatch through this registry instead of comparing method names: the API checks a
request against its method (`Method.check`, `Method.refusal`), the engine picks the pruner for a
method's `kind` (`workers.pruners`). Adding a method means one entry here, one engine function
there. The science of each method is in docs/science.md.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from core.families import refusal_reason, stock_layout_refusal
from core.param_count import sliced_width

DENSE: Final = "dense"
"""The method name results of an unpruned model are stored under (sparsity 0)."""
DEFAULT_METHOD: Final = "slicegpt"
"""What predictions, curves and the CLI assume when no method is named."""

UNSTRUCTURED = "unstructured"
NM_PATTERNS: tuple[str, ...] = ("2:4", "4:8")
NM_SPARSITY = 0.5
"""The only sparsity an N:M pattern gives: N of every M consecutive weights are zeroed."""

SLICED_ARTIFACT = "sliced-model"
"""A SliceGPT model: `workers.slicing.artifacts.load_sliced` reads both layouts; outside prunecast a
stock-layout folder loads with `from_pretrained`, a per-layer one with `trust_remote_code=True`."""
PRUNED_ARTIFACT = "pruned-model"
"""A stock transformers checkpoint plus prunecast_pruning.json: `from_pretrained` loads it."""

PER_LAYER_LAYOUT: Final = "per-layer"
"""SliceGPT as published: one basis per residual signal, joined by skip matrices (prunecast's own format)."""
STOCK_LAYOUT: Final = "stock"
"""One basis shared by every residual signal: the sliced model is the stock architecture at hidden_size d."""
SLICED_LAYOUTS: tuple[str, ...] = (PER_LAYER_LAYOUT, STOCK_LAYOUT)

CAUSAL_LM_SUFFIXES = ("ForCausalLM", "LMHeadModel")
LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers")


class MethodKind(enum.StrEnum):
    slicing = "slicing"  # removes residual-stream width (rotations, then deletion)
    intra_layer = "intra-layer"  # zeroes weights inside every block linear
    drop = "drop"  # removes whole branches or blocks


class Simulation(enum.StrEnum):
    """How a `simulate` job reproduces a method on the dense model without pruning it (docs/science.md
    §2, "Simulated curves")."""

    projection = "projection"  # slicing: every residual signal projected on its basis' top-d span
    own_mask = "own-mask"  # the method's own mask, applied to the dense weights for one forward
    wanda_mask = "wanda-mask"  # Wanda's mask without the method's own weights: a proxy, not a bound


PROXY_MASK_METHOD: Final = "wanda"
"""Whose mask `Simulation.wanda_mask` applies."""


@dataclass(frozen=True)
class Refusal:
    """Why a model cannot be pruned as asked, and the problem slug the API answers with."""

    reason: str
    slug: str  # "unsupported-architecture" | "invalid-sparsity"
    title: str


@dataclass(frozen=True)
class Method:
    """One pruning method."""

    name: str  # as requests name it
    kind: MethodKind
    summary: str  # one sentence for the API docs
    calibrated: bool  # reads calibration data
    removes: str | None = None  # drops: what each dropped layer loses
    nm_patterns: bool = True  # takes N:M patterns (intra-layer methods only)
    simulation: Simulation | None = None  # how `simulate` jobs reproduce it; None: they refuse it

    @property
    def patterns(self) -> tuple[str, ...]:
        """Sparsity patterns it takes (N:M only where it zeroes weights)."""
        if self.kind is MethodKind.intra_layer and self.nm_patterns:
            return (UNSTRUCTURED, *NM_PATTERNS)
        return (UNSTRUCTURED,)

    @property
    def layouts(self) -> tuple[str, ...]:
        """Layouts a request may ask for: only slicing changes the architecture, the others have none."""
        return SLICED_LAYOUTS if self.kind is MethodKind.slicing else ()

    @property
    def stage(self) -> str:
        """The job stage its work is reported under."""
        return "slicing" if self.kind is MethodKind.slicing else "pruning"

    @property
    def artifact_kind(self) -> str:
        return SLICED_ARTIFACT if self.kind is MethodKind.slicing else PRUNED_ARTIFACT

    @property
    def strict_law_applies(self) -> bool:
        """The strict law PPL0 ** (1 / (1 - s)) is a law of slicing (docs/science.md §2); the other
        methods' fits are empirical curves in their own sparsity."""
        return self.kind is MethodKind.slicing

    def simulates_exactly(self, layout: str | None = None) -> bool:
        """Whether its simulation's face value is the pruned model itself (up to float rounding): a mask
        that reads no data, or slicing's stock layout, whose one basis the method too takes from the
        dense stream."""
        if self.simulation is Simulation.own_mask:
            return not self.calibrated
        return self.simulation is Simulation.projection and layout == STOCK_LAYOUT

    def stored_name(self, pattern: str = UNSTRUCTURED, layout: str | None = None) -> str:
        """The method name results are stored under: an N:M pattern or the stock layout is part of it
        ("wanda-2:4", "slicegpt-stock"), so curves, fits, predictions and exports never mix them."""
        name = self.name if pattern == UNSTRUCTURED else f"{self.name}-{pattern}"
        return f"{name}-{STOCK_LAYOUT}" if layout == STOCK_LAYOUT else name

    def stored_names(self) -> tuple[str, ...]:
        return tuple(
            self.stored_name(pattern, layout)
            for pattern in self.patterns
            for layout in self.layouts or (None,)
        )

    def check(
        self, sparsity: float, pattern: str, slice_head: bool | None = None, layout: str | None = None
    ) -> None:
        """The request rules every job kind that carries this method follows (ValueError: why not)."""
        if pattern not in self.patterns:
            takers = ", ".join(m.name for m in METHODS.values() if pattern in m.patterns)
            raise ValueError(
                f"pattern {pattern!r} only applies to {takers} (got method {self.name!r}); leave pattern "
                f"at '{UNSTRUCTURED}'"
            )
        if pattern != UNSTRUCTURED and sparsity != NM_SPARSITY:
            kept, group = pattern.split(":")
            raise ValueError(
                f"pattern {pattern!r} zeroes {kept} of every {group} weights, so its sparsity is fixed at "
                f"{NM_SPARSITY}; set sparsity to {NM_SPARSITY} (got {sparsity:g}) or use pattern "
                f"'{UNSTRUCTURED}'"
            )
        if slice_head is not None and self.kind is not MethodKind.slicing:
            raise ValueError(f"slice_head is a slicegpt option; leave it null for method {self.name!r}")
        if layout is not None and layout not in self.layouts:
            raise ValueError(
                f"layout {layout!r} is a slicegpt option (the other methods keep the stock architecture); "
                f"leave it null for method {self.name!r}"
            )
        if layout == STOCK_LAYOUT and slice_head is False:
            raise ValueError(
                "the stock layout has hidden_size d everywhere, the LM head's input included; leave "
                "slice_head null or true with layout 'stock'"
            )

    def refusal(
        self,
        config: Mapping[str, Any],
        sparsities: Sequence[float],
        round_to: int,
        layout: str | None = None,
    ) -> Refusal | None:
        """Why the model with this config cannot be pruned at these sparsities (in this layout), from
        the config alone (the API refuses at submit what the worker would refuse after loading), or None."""
        if self.kind is MethodKind.slicing:
            return _slicing_refusal(config, sparsities, round_to, layout)
        reason = causal_lm_refusal(config)
        if reason is not None:
            return Refusal(reason, "unsupported-architecture", "Model cannot be pruned with this method")
        if self.kind is MethodKind.drop:
            for sparsity in sparsities:
                if (reason := self.drop_refusal(sparsity, config)) is not None:
                    return Refusal(reason, "invalid-sparsity", "Nothing left")
        return None

    def drop_refusal(self, sparsity: float, config: Mapping[str, Any]) -> str | None:
        """Why dropping this fraction of the model's layers leaves nothing, or None."""
        layers = num_layers(config)
        if layers is None:
            return None
        dropped = layers_dropped(sparsity, layers)
        if dropped < layers:
            return None
        return (
            f"{self.name} at sparsity {sparsity:g} removes round({sparsity:g} * {layers}) = {dropped} of the "
            f"model's {layers} layers, i.e. every {self.removes}; use a sparsity below "
            f"{(layers - 0.5) / layers:.3g}"
        )


METHODS: dict[str, Method] = {
    method.name: method
    for method in (
        Method(
            "slicegpt",
            MethodKind.slicing,
            "remove a fraction of the residual-stream width (SliceGPT, ICLR 2024)",
            calibrated=True,
            simulation=Simulation.projection,
        ),
        Method(
            "magnitude",
            MethodKind.intra_layer,
            "zero the weights of smallest |W| in each linear, one threshold per layer (the baseline of "
            "the Wanda and SparseGPT papers)",
            False,
            simulation=Simulation.own_mask,
        ),
        Method(
            "magnitude-row",
            MethodKind.intra_layer,
            "zero the weights of smallest |W| within each output row (Wanda's comparison group; "
            "unstructured only: N:M is per row for every method)",
            False,
            nm_patterns=False,
            simulation=Simulation.own_mask,
        ),
        Method(
            "wanda",
            MethodKind.intra_layer,
            "zero the weights of smallest |W| * ||X|| (input activation norm from the calibration data), "
            "compared within each output row",
            calibrated=True,
            simulation=Simulation.own_mask,
        ),
        Method(
            "sparsegpt",
            MethodKind.intra_layer,
            "OBS-style pruning with the layer's Hessian X X^T, updating the kept weights; blocks of 128 "
            "columns, 1% damping",
            calibrated=True,
            simulation=Simulation.wanda_mask,
        ),
        Method(
            "attention-drop",
            MethodKind.drop,
            "remove the attention branches that change the residual stream least (highest cosine between "
            "the branch's input and output residual on the calibration data)",
            calibrated=True,
            removes="attention branch",
        ),
        Method(
            "mlp-drop",
            MethodKind.drop,
            "remove the MLP branches that change the residual stream least (same score)",
            calibrated=True,
            removes="MLP branch",
        ),
        Method(
            "shortgpt",
            MethodKind.drop,
            "remove whole blocks of lowest Block Influence BI = 1 - mean cos(h_in, h_out)",
            calibrated=True,
            removes="block",
        ),
    )
}
METHOD_NAMES: tuple[str, ...] = tuple(METHODS)
STORED_METHOD_NAMES: tuple[str, ...] = tuple(name for m in METHODS.values() for name in m.stored_names())


def method(name: str) -> Method:
    """The registry entry of `name` (KeyError names the known ones)."""
    try:
        return METHODS[name]
    except KeyError:
        raise KeyError(f"unknown pruning method {name!r}; known: {', '.join(METHOD_NAMES)}") from None


def stored_method_entry(stored: str) -> Method | None:
    """The registry entry a stored method name ("wanda-2:4", "slicegpt-stock") belongs to, or None."""
    return next((m for m in METHODS.values() if stored in m.stored_names()), None)


def simulated_methods() -> tuple[str, ...]:
    """The methods a `simulate` job can reproduce from one dense pass."""
    return tuple(name for name, entry in METHODS.items() if entry.simulation is not None)


def methods_of(kind: MethodKind) -> tuple[str, ...]:
    return tuple(name for name, entry in METHODS.items() if entry.kind is kind)


def result_method(name: str, pattern: str = UNSTRUCTURED, layout: str | None = None) -> str:
    """The stored method name of `name` with `pattern` and `layout` (see `Method.stored_name`)."""
    return method(name).stored_name(pattern, layout)


def layers_dropped(sparsity: float, num_layers: int) -> int:
    """n = round(sparsity * L): how many attention branches, MLP branches or blocks a drop removes
    (Python's round: halves go to the even integer)."""
    return round(sparsity * num_layers)


def num_layers(config: Mapping[str, Any]) -> int | None:
    """The number of blocks L, when the config says it."""
    for key in LAYER_COUNT_KEYS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def causal_lm_refusal(config: Mapping[str, Any]) -> str | None:
    """Why a model with this config is not a decoder-only causal LM (what the intra-layer and drop
    methods prune), or None when it is, or when the config does not say."""
    architectures = [a for a in config.get("architectures") or [] if isinstance(a, str)]
    described = f"{architectures[0] if architectures else 'model'} (model_type {config.get('model_type')!r})"
    if config.get("is_encoder_decoder"):
        return f"{described} is an encoder-decoder model; only decoder-only causal LMs can be pruned"
    if architectures and not any(a.endswith(CAUSAL_LM_SUFFIXES) for a in architectures):
        return (
            f"{described} is not a causal language model (its architectures are "
            f"{', '.join(architectures)}; expected a *ForCausalLM or *LMHeadModel class)"
        )
    return None


def _slicing_refusal(
    config: Mapping[str, Any], sparsities: Sequence[float], round_to: int, layout: str | None
) -> Refusal | None:
    reason = refusal_reason(config)
    if reason is None and layout == STOCK_LAYOUT:
        reason = stock_layout_refusal(config)
    if reason is not None:
        return Refusal(reason, "unsupported-architecture", "Model cannot be pruned with this method")
    hidden_size = config.get("hidden_size", config.get("n_embd"))
    if isinstance(hidden_size, int):
        try:
            for sparsity in sparsities:
                sliced_width(hidden_size, sparsity, round_to)
        except ValueError as error:
            return Refusal(f"{error}; lower sparsity or round_to", "invalid-sparsity", "Nothing left")
    return None
