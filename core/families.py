"""Which model families the SliceGPT engine supports, decided from a config dict alone.

This module deliberately imports nothing heavy (no torch, no transformers): the HTTP side calls
`family_from_config` and `refusal_reason` at submit time to reject a job before it is queued.
The engine side recognises a loaded model by its module structure (`workers.architectures`),
and uses the same family names and the same refusal texts, so both sides say the same thing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Family:
    """One supported family: the adapter name and what HF calls its members."""

    name: str  # adapter name, stored in artifacts (slicing_config.json "family")
    model_types: tuple[str, ...]  # HF config `model_type` values of members
    architectures: tuple[str, ...]  # HF config `architectures` class names of members


FAMILIES: tuple[Family, ...] = (
    Family(
        "llama",
        ("llama", "mistral", "qwen2", "qwen3"),
        ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"),
    ),
    Family("phi3", ("phi3",), ("Phi3ForCausalLM",)),
    Family("opt", ("opt",), ("OPTForCausalLM",)),
    Family("gpt2", ("gpt2",), ("GPT2LMHeadModel",)),
    Family("phi", ("phi",), ("PhiForCausalLM",)),  # Phi-1.5, Phi-2: parallel residual, one norm
    Family("gpt_neox", ("gpt_neox",), ("GPTNeoXForCausalLM",)),  # Pythia: parallel residual
    # Gemma-2/3 (text): a norm on each branch's output, sliced by projecting after it
    Family("gemma", ("gemma2", "gemma3_text"), ("Gemma2ForCausalLM", "Gemma3ForCausalLM")),
)
FAMILY_NAMES: tuple[str, ...] = tuple(family.name for family in FAMILIES)

# Families we know and refuse on purpose, with the reason (matched on `model_type`).
_KNOWN_REFUSALS: dict[str, str] = {
    "olmo2": (
        "its blocks read the residual stream with no norm before attention and the MLP and normalise "
        "only the branch outputs, and its q/k norms span all heads; the engine has no adapter for "
        "that structure"
    ),
    "gemma3": (
        "this is the multimodal Gemma-3 (Gemma3ForConditionalGeneration); slice its text model, "
        "saved as Gemma3ForCausalLM (model_type gemma3_text)"
    ),
}


SLICED_MODEL_TYPE = "prunecast_sliced"
"""config.json model_type of prunecast's per-layer sliced folders: their `auto_map` names the portable
code they carry for other programs; prunecast itself reads them with its own loader, never that code."""


# Families whose sliced model can be the stock architecture at hidden_size d (one shared basis): their
# norms are RMSNorms, which a rotation of the whole stream commutes with, and their blocks sequential.
_STOCK_LAYOUT_FAMILIES = frozenset({"llama", "phi3"})
_STOCK_LAYOUT_REASON = (
    "the stock layout keeps the family's own norms at width d, and its norms are LayerNorms: a "
    "LayerNorm subtracts the mean of its input's coordinates, which in the rotated and sliced basis is "
    "a different operation (the engine removes the mean from the stream and replaces the norms "
    "instead, which stock transformers cannot express); use layout 'per-layer'. The stock layout "
    "exists for RMSNorm families: "
)
_STOCK_LAYOUT_REASONS: dict[str, str] = {
    "gemma": (
        "its blocks normalise each branch's output before the residual add; at width d the stock "
        "block would normalise the rotated, sliced output coordinate by coordinate, which is not what "
        "the dense norm computed (the per-layer layout keeps that norm at width D and projects after "
        "it, a matrix stock transformers has no place for); use layout 'per-layer'. The stock layout "
        "exists for families whose only norms read the residual stream: "
    ),
}


# Families whose HF forward reshapes the final stream to the embedding width (GPT-2's
# `hidden_states.view(output_shape)` after ln_f), so the LM head must be sliced along with it.
_HEAD_SLICED_BY_DEFAULT = frozenset({"gpt2"})


def head_sliced_by_default(family: str) -> bool:
    """Whether slicing keeps d (not D) columns of the LM head for this family unless told otherwise.

    SliceGPT leaves the head at full width by default; GPT-2's forward needs the final stream to
    have the embeddings' width, so its head is always sliced.
    """
    return family in _HEAD_SLICED_BY_DEFAULT


def head_must_be_sliced(family: str) -> bool:
    """Whether this family cannot run with an unsliced head at all."""
    return family in _HEAD_SLICED_BY_DEFAULT


class UnsupportedArchitectureError(ValueError):
    """The model cannot be sliced; the message says why and lists what is supported."""


def supported_families_text() -> str:
    """Human-readable list, e.g. 'llama (LlamaForCausalLM, ...), phi3 (Phi3ForCausalLM), ...'."""
    return ", ".join(f"{family.name} ({', '.join(family.architectures)})" for family in FAMILIES)


def describe_architecture(config: Mapping[str, Any]) -> str:
    """'GPTNeoXForCausalLM (model_type gpt_neox)' from a config dict, for error messages."""
    architectures = config.get("architectures") or []
    name = architectures[0] if architectures else "an unknown architecture"
    return f"{name} (model_type {config.get('model_type')!r})"


def unsupported_message(config: Mapping[str, Any], reason: str, *, into: str = "") -> str:
    """The one error text used everywhere: what the model is, why it is refused (`into`: the layout
    it is refused in, if only that one), what works."""
    return (
        f"model uses {describe_architecture(config)}, which SliceGPT cannot slice{into}: {reason}. "
        f"Supported families: {supported_families_text()}"
    )


def family_from_config(config: Mapping[str, Any]) -> str | None:
    """Family name for a HF config dict, from its `architectures` and `model_type` keys only.

    Returns None when the model is not in a supported family. A known family can still be
    refused for a config detail (see `refusal_reason`).
    """
    architectures = config.get("architectures") or []
    for family in FAMILIES:
        if any(architecture in family.architectures for architecture in architectures):
            return family.name
    model_type = config.get("model_type")
    for family in FAMILIES:
        if model_type in family.model_types:
            return family.name
    return None


def refusal_reason(config: Mapping[str, Any]) -> str | None:
    """Why a model with this config dict cannot be sliced, or None if it can.

    The text is complete (names the architecture and the supported families) so callers can
    put it straight into a problem response or a failed job's error.
    """
    known = known_refusal(config)
    if known is not None:
        return known
    family = family_from_config(config)
    if family is None:
        return unsupported_message(config, "no adapter recognises this family")
    return family_config_refusal(family, config)


def known_refusal(config: Mapping[str, Any]) -> str | None:
    """The reason for a family we know and refuse on purpose (by `model_type`), else None."""
    model_type = config.get("model_type")
    if isinstance(model_type, str) and model_type in _KNOWN_REFUSALS:
        return unsupported_message(config, _KNOWN_REFUSALS[model_type])
    return None


def stock_layout_refusal(config: Mapping[str, Any]) -> str | None:
    """Why a sliceable model with this config cannot be sliced into the stock layout, or None."""
    family = family_from_config(config)
    if family is None or family in _STOCK_LAYOUT_FAMILIES:
        return None  # unknown families are refused by `refusal_reason` already
    supported = ", ".join(f.name for f in FAMILIES if f.name in _STOCK_LAYOUT_FAMILIES)
    reason = _STOCK_LAYOUT_REASONS.get(family, _STOCK_LAYOUT_REASON)
    return unsupported_message(config, reason + supported, into=" into the stock layout")


def family_config_refusal(family: str, config: Mapping[str, Any]) -> str | None:
    """Config details that a family's adapter cannot handle, else None."""
    if family == "opt":
        hidden = config.get("hidden_size")
        projected = config.get("word_embed_proj_dim", hidden)
        if projected != hidden:
            return unsupported_message(
                config,
                f"word_embed_proj_dim ({projected}) differs from hidden_size ({hidden}), so project_in/"
                "project_out sit between the embeddings and the residual stream; slicing them is not "
                "implemented (OPT-350m is the known case)",
            )
        if not config.get("do_layer_norm_before", True):
            return unsupported_message(
                config,
                "do_layer_norm_before is false (post-LayerNorm blocks), which is not rotation-invariant",
            )
    if family == "gpt2" and config.get("add_cross_attention", False):
        return unsupported_message(
            config, "add_cross_attention is set; cross-attention blocks are not handled"
        )
    return None
