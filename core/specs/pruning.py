"""The pruning fields that prune, sweep and probe requests share, spelled from the method registry.

The method literals are built from `core.methods` (the OpenAPI schema lists exactly its methods and
the names their results are stored under), so adding a method is a registry entry plus its engine.
Type checkers see them as `str`: a literal built at run time is not a static type.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, get_args

from core.methods import (
    METHODS,
    NM_PATTERNS,
    SLICED_LAYOUTS,
    STORED_METHOD_NAMES,
    UNSTRUCTURED,
    MethodKind,
    methods_of,
)

if TYPE_CHECKING:
    PruneMethod = str
    StoredMethod = str
else:
    PruneMethod = Literal[tuple(METHODS)]
    StoredMethod = Literal[STORED_METHOD_NAMES]
    """The method names results are stored under: an N:M pattern or the stock layout is part of the name."""
SparsityPattern = Literal["unstructured", "2:4", "4:8"]
SlicedLayout = Literal["per-layer", "stock"]

if set(get_args(SparsityPattern)) != {UNSTRUCTURED, *NM_PATTERNS}:
    raise AssertionError("SparsityPattern must list exactly the patterns of core.methods")
if set(get_args(SlicedLayout)) != set(SLICED_LAYOUTS):
    raise AssertionError("SlicedLayout must list exactly core.methods.SLICED_LAYOUTS")

METHOD_DESCRIPTION = "How the model is pruned (docs/science.md §1, §3). " + " ".join(
    f"`{entry.name}`: {entry.summary}." for entry in METHODS.values()
)
SPARSITY_DESCRIPTION = (
    "Fraction removed; what it counts depends on `method`. `slicegpt`: the fraction of the residual "
    "width D removed (d = floor((1 - sparsity) * D), rounded down to `round_to`), not of parameters; "
    "the real parameter fraction is reported as the `param_fraction_removed` result. "
    + ", ".join(f"`{name}`" for name in methods_of(MethodKind.intra_layer))
    + ": the fraction of the weights of each pruned linear set to zero (0.5 with an N:M `pattern`). "
    + ", ".join(f"`{name}`" for name in methods_of(MethodKind.drop))
    + ": the fraction of the L layers removed, n = round(sparsity * L) attention branches, MLP branches "
    "or blocks."
)
PATTERN_DESCRIPTION = (
    f"Where the zeros may fall ({', '.join(f'`{name}`' for name in methods_of(MethodKind.intra_layer))} "
    "only). `unstructured`: anywhere in the comparison group. `2:4` / `4:8`: N of every M consecutive "
    "input weights of a row (hardware sparse kernels); the sparsity is then N/M = 0.5."
)
ROUND_TO_DESCRIPTION = (
    "`slicegpt` only (ignored by the other methods): round the kept width d down to a multiple of this."
)
SLICE_HEAD_DESCRIPTION = (
    "`slicegpt` only (refused for the other methods): also slice the LM head's input. null: the "
    "family's default (no, except GPT-2, whose forward needs it)."
)
LAYOUT_DESCRIPTION = (
    "`slicegpt` only (refused for the other methods, whose models keep the stock architecture). "
    "`per-layer` (null means this): SliceGPT as published, one basis per residual signal joined by skip "
    "matrices; best perplexity, saved in prunecast's own format. `stock`: one basis shared by every "
    "signal, so the sliced model is the stock transformers architecture with hidden_size d and its "
    "artifact loads with plain `AutoModelForCausalLM.from_pretrained`; RMSNorm families only (Llama, "
    "Mistral, Qwen2/3, Phi-3, SmolLM); results are stored under method `slicegpt-stock`."
)
KEEP_BASES_DESCRIPTION = (
    "`slicegpt` only (ignored by the other methods): save, next to the sliced model, the kept directions "
    "of every block-boundary signal (`slicing_bases.st`: L + 1 matrices of D x d for `per-layer`, one "
    "for `stock`; float32, about 5 % of SmolLM2's per-layer artifact), so that probes of the artifact "
    "compare its blocks with the dense ones. Probes that prune in the job always keep them."
)
