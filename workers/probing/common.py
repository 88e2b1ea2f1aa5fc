"""What the probes share: the family adapter of both models, whether their residual streams can
be compared coordinate by coordinate, hidden-state capture hooks and token chunking."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from workers.architectures import FamilyAdapter, match_structure
from workers.slicing.portable.sliced_modules import WrappedBlock

LOGIT_CHUNK_BYTES = 32 * 2**20  # one (tokens x vocab) float64 tensor; about 8 live at once: ~256 MB


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def family_adapters(dense: nn.Module, pruned: nn.Module) -> tuple[FamilyAdapter, FamilyAdapter]:
    """The adapters of both models, which must be of one family."""
    dense_adapter, pruned_adapter = match_structure(dense), match_structure(pruned)
    if type(dense_adapter) is not type(pruned_adapter):
        raise ValueError(
            f"the pruned model has the structure of family {pruned_adapter.name!r}, "
            f"the dense one of {dense_adapter.name!r}; probes compare a model with its own pruned version"
        )
    return dense_adapter, pruned_adapter


def hidden_width(adapter: FamilyAdapter, model: nn.Module) -> int:
    """Width of the residual stream: what the token embedding writes."""
    return int(adapter.embeddings(model)[0].embedding_dim)


def residual_mismatch(adapter: FamilyAdapter, dense: nn.Module, pruned: nn.Module) -> str | None:
    """Why hidden states of the two models cannot be compared coordinate by coordinate, or None.

    A SliceGPT model's stream is narrower and lives in a rotated basis (its blocks are wrapped
    with skip matrices; its LM head may keep the full width); even sliced at 0% its coordinates
    are not the dense model's.
    """
    dense_width, pruned_width = hidden_width(adapter, dense), hidden_width(adapter, pruned)
    if dense_width != pruned_width:
        return f"the pruned residual stream is {pruned_width} wide, the dense one {dense_width} (sliced)"
    if any(isinstance(block, WrappedBlock) for block in adapter.blocks(pruned)):
        return "the pruned model is sliced: its residual stream lives in a rotated basis"
    return None


def block_hidden(output: Any) -> torch.Tensor:
    """The hidden states a decoder block returns (some families return a tuple)."""
    return output[0] if isinstance(output, tuple | list) else output


def token_chunks(tokens: int, vocab: int) -> Iterator[slice]:
    """Slices of at most LOGIT_CHUNK_BYTES / (8 * vocab) tokens (at least one)."""
    rows = max(1, LOGIT_CHUNK_BYTES // (8 * vocab))
    for start in range(0, tokens, rows):
        yield slice(start, min(start + rows, tokens))


@contextmanager
def capture_last_positions(
    adapter: FamilyAdapter, model: nn.Module, *, blocks: bool
) -> Iterator[dict[str, Any]]:
    """While active, `found["final"]` holds the final norm's input at the last position of the
    latest forward (the final hidden state, before the norm), and with `blocks` `found["blocks"][i]`
    the output of block i at that position. Tensors are (D,)."""
    found: dict[str, Any] = {"final": None, "blocks": [None] * len(adapter.blocks(model))}

    def final_hook(module: nn.Module, args: tuple[Any, ...]) -> None:
        found["final"] = args[0][0, -1].detach()

    def block_hook(index: int) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            found["blocks"][index] = block_hidden(output)[0, -1].detach()

        return hook

    handles = [adapter.final_norm(model).register_forward_pre_hook(final_hook)]
    if blocks:
        handles += [
            block.register_forward_hook(block_hook(index))
            for index, block in enumerate(adapter.blocks(model))
        ]
    try:
        yield found
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def capture_final_hidden(adapter: FamilyAdapter, model: nn.Module) -> Iterator[dict[str, Any]]:
    """While active, `found["final"]` holds the final norm's whole input (B, T, D) of the latest forward."""
    found: dict[str, Any] = {"final": None}

    def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
        found["final"] = args[0].detach()

    handle = adapter.final_norm(model).register_forward_pre_hook(hook)
    try:
        yield found
    finally:
        handle.remove()
