"""Model structure: one adapter per model family, naming its blocks, norms and each sublayer's
readers and writers, and recognition of a loaded model's family. Every engine (slicing, pruning,
probing, profiling, simulation, block streaming) reads models through it; import from this package,
never from its modules (tests/test_architecture.py checks). Adding a family: docs/development.md."""

from __future__ import annotations

from typing import cast

from torch import nn
from transformers import PreTrainedModel

from core.families import (
    FAMILY_NAMES,
    UnsupportedArchitectureError,
    describe_architecture,
    known_refusal,
    supported_families_text,
    unsupported_message,
)
from workers.architectures.base import FamilyAdapter, config_dict
from workers.architectures.gemma import GemmaAdapter
from workers.architectures.gpt2 import GPT2Adapter
from workers.architectures.gpt_neox import GPTNeoXAdapter
from workers.architectures.llama import LlamaAdapter
from workers.architectures.opt import OPTAdapter
from workers.architectures.phi import PhiAdapter
from workers.architectures.phi3 import Phi3Adapter

# More specific structures first: Gemma's blocks contain Llama's.
ADAPTERS: tuple[type[FamilyAdapter], ...] = (
    GemmaAdapter,
    LlamaAdapter,
    Phi3Adapter,
    OPTAdapter,
    GPT2Adapter,
    PhiAdapter,
    GPTNeoXAdapter,
)

__all__ = [
    "ADAPTERS",
    "FamilyAdapter",
    "GPT2Adapter",
    "GPTNeoXAdapter",
    "GemmaAdapter",
    "LlamaAdapter",
    "OPTAdapter",
    "Phi3Adapter",
    "PhiAdapter",
    "UnsupportedArchitectureError",
    "adapter_for_family",
    "config_dict",
    "detect_family",
    "match_structure",
]


def detect_family(model: PreTrainedModel) -> FamilyAdapter:
    """The adapter whose module structure the model has, after checking config details and norms.

    Raises UnsupportedArchitectureError naming the architecture, the reason and the supported
    families when no adapter fits or the fitting one cannot handle this model.
    """
    config = config_dict(model)
    refusal = known_refusal(config)
    if refusal is not None:
        raise UnsupportedArchitectureError(refusal)
    for adapter_class in ADAPTERS:
        if adapter_class.matches(model):
            adapter = adapter_class()
            problem = adapter.problems(model)
            if problem is not None:
                raise UnsupportedArchitectureError(problem)
            return adapter
    raise UnsupportedArchitectureError(
        unsupported_message(config, "no adapter recognises its module structure")
    )


def match_structure(model: nn.Module) -> FamilyAdapter:
    """The adapter whose module structure the model has, without the checks only slicing needs
    (rotation-invariant norms, no unknown modules in blocks): enough to find blocks, norms, head and
    each branch's linears, as pruners and probes do.

    Raises UnsupportedArchitectureError when no adapter recognises the structure.
    """
    for adapter_class in ADAPTERS:
        if adapter_class.matches(model):
            return adapter_class()
    architecture = describe_architecture(config_dict(cast(PreTrainedModel, model)))
    raise UnsupportedArchitectureError(
        f"model uses {architecture}, whose module structure no family "
        f"adapter recognises (blocks, norms, each branch's linears). Supported families: "
        f"{supported_families_text()}"
    )


def adapter_for_family(name: str) -> FamilyAdapter:
    """The adapter for a family name (as stored in a sliced artifact)."""
    for adapter_class in ADAPTERS:
        if adapter_class.name == name:
            return adapter_class()
    raise UnsupportedArchitectureError(
        f"unknown family {name!r}; supported families: {', '.join(FAMILY_NAMES)}"
    )
