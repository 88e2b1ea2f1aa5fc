"""What block 0 of a decoder receives, for engines that calibrate block by block.

SliceGPT, Wanda, SparseGPT, layer drop and ShortGPT all walk the decoder one block at a time on
calibration data. Running the whole model for every block would cost L full passes; instead each
batch runs through the embeddings only, and what block 0 would receive (hidden states plus every
other call argument: masks, position embeddings, cache flags) is kept. Each engine then calls
block i on those inputs and keeps block i's outputs as block i+1's inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from transformers import PreTrainedModel

from core.families import UnsupportedArchitectureError

if TYPE_CHECKING:  # the adapters import torch-heavy slicing modules; only their type is needed here
    from workers.slicing.adapters import FamilyAdapter


@dataclass
class BlockBatch:
    """One calibration batch at the current point of the stream."""

    hidden: torch.Tensor  # (B, T, width), model dtype, on the model's home device
    keep: torch.Tensor  # (B, T) bool, False at padded positions
    args: tuple[Any, ...]  # the block call's other positional arguments (on the home device)
    kwargs: dict[str, Any]  # the block call's keyword arguments: masks, positions, cache flags


class _ReachedBlockZero(Exception):
    """Raised by the capture hook so the forward pass stops at block 0."""


def move_to(value: Any, device: torch.device) -> Any:
    """`value` with every tensor inside (nested tuples, lists, dicts) moved to `device`."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, tuple | list):
        return type(value)(move_to(item, device) for item in value)
    if isinstance(value, dict):
        return {key: move_to(item, device) for key, item in value.items()}
    return value


def home_device(model: nn.Module) -> torch.device:
    """Where the model's parameters live (its first parameter's device)."""
    return next(model.parameters()).device


def mixed_layer_types(model: PreTrainedModel) -> str | None:
    """Why block 0's call arguments cannot serve every block, or None.

    Models whose layers differ in attention type (`config.layer_types`: Gemma-2/3's sliding and full
    layers, Qwen2 with sliding layers) give each type its own mask and rotary tables; replaying
    block 0's would calibrate the other layers on the wrong attention, silently.
    """
    layer_types = getattr(model.config, "layer_types", None)
    if not isinstance(layer_types, list | tuple) or len(set(layer_types)) <= 1:
        return None
    return (
        f"its layers mix attention types ({', '.join(sorted(set(map(str, layer_types))))} in "
        "config.layer_types); block-by-block calibration replays one layer's masks and rotary tables "
        "for all layers, so models with mixed layer types are not supported by it yet"
    )


@torch.no_grad()
def capture_block_inputs(
    model: PreTrainedModel,
    adapter: FamilyAdapter,
    input_ids: torch.Tensor,
    keep: torch.Tensor,
    batch_size: int,
    compute: torch.device,
    home: torch.device,
) -> list[BlockBatch]:
    """Run each batch through the embeddings only; keep what block 0 would have received.

    `input_ids` and `keep` are (N, T); batches of `batch_size` rows run on `compute` and what they
    give block 0 is stored on `home`.
    """
    refusal = mixed_layer_types(model)
    if refusal is not None:
        raise UnsupportedArchitectureError(refusal)
    decoder = adapter.decoder(model)
    blocks = adapter.blocks(model)
    # Everything the decoder owns before the blocks (embeddings, rotary tables...) goes to the
    # compute device; the blocks and the head stay home.
    front = [child for child in decoder.children() if child is not blocks]
    for module in front:
        module.to(compute)
    captured: dict[str, Any] = {}

    def stop_at_block_zero(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        captured["args"], captured["kwargs"] = args, dict(kwargs)
        raise _ReachedBlockZero

    handle = blocks[0].register_forward_pre_hook(stop_at_block_zero, with_kwargs=True)
    batches = []
    try:
        for start in range(0, input_ids.shape[0], batch_size):
            ids = input_ids[start : start + batch_size].to(compute)  # (B, T)
            mask = keep[start : start + batch_size]  # (B, T)
            try:
                model(
                    input_ids=ids, attention_mask=mask.to(device=compute, dtype=torch.long), use_cache=False
                )
            except _ReachedBlockZero:
                pass
            else:
                raise RuntimeError("the forward pass never reached block 0")
            args, kwargs = captured["args"], captured["kwargs"]
            hidden = args[0] if args else kwargs.pop("hidden_states")
            batches.append(
                BlockBatch(hidden.to(home), mask.to(home), move_to(args[1:], home), move_to(kwargs, home))
            )
    finally:
        handle.remove()
        for module in front:
            module.to(home)
    return batches
