"""What each decoder block receives, for engines that calibrate block by block.

SliceGPT, Wanda, SparseGPT, layer drop and ShortGPT all walk the decoder one block at a time on
calibration data. Running the whole model for every block would cost L full passes; instead each
batch runs through the embeddings only, and what the blocks would receive (hidden states plus every
other call argument: masks, position embeddings, cache flags) is kept. Each engine then calls
block i on those inputs and keeps block i's outputs as block i+1's inputs.

Models whose layers differ in attention type (`config.layer_types`: Gemma-2/3's sliding and full
layers, Qwen2 with sliding layers) give each type its own mask and rotary tables. The capture keeps
one call per layer type, taken at the first block of that type, and `BlockBatch.call(i)` hands
block i its own type's. To get there without running any block, every block's forward is replaced
for the capture by one that records its arguments and passes the hidden states through unchanged:
the decoder computes each type's masks and tables before its loop, so what reaches block i is what
block i would have been called with, the hidden states aside (those come from block 0's call).

Here too: the mask of the calibration windows' real tokens that the capture takes
(`calibration_keep`), and the progress and stop callbacks a block-by-block engine is given
(`ProgressCallback`, `StopCheck`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from workers.architectures import FamilyAdapter

BlockCall = tuple[tuple[Any, ...], dict[str, Any]]  # a block's other positional and keyword arguments
ProgressCallback = Callable[[int, int], None]  # (blocks done, number of blocks)
StopCheck = Callable[[], bool]  # True asks the engine to stop before the next block


@dataclass
class BlockBatch:
    """One calibration batch at the current point of the stream."""

    hidden: torch.Tensor  # (B, T, width), model dtype, on the model's home device
    keep: torch.Tensor  # (B, T) bool, False at padded positions
    calls: list[BlockCall]  # one per distinct layer type (one for uniform models), on the home device
    call_of_block: tuple[int, ...] = field(default_factory=tuple)  # block index -> calls entry; () all 0

    def call(self, index: int) -> BlockCall:
        """Block `index`'s arguments besides the hidden states: its layer type's masks and tables."""
        return self.calls[self.call_of_block[index] if self.call_of_block else 0]


class _Captured(Exception):
    """Raised by the recording forward once every layer type's call is kept: the pass stops there."""


def map_tensors(value: Any, change: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """`value` with `change` applied to every tensor inside (nested tuples, lists, dicts)."""
    if isinstance(value, torch.Tensor):
        return change(value)
    if isinstance(value, tuple | list):
        return type(value)(map_tensors(item, change) for item in value)
    if isinstance(value, dict):
        return {key: map_tensors(item, change) for key, item in value.items()}
    return value


def move_to(value: Any, device: torch.device) -> Any:
    """`value` with every tensor inside (nested tuples, lists, dicts) moved to `device`."""
    return map_tensors(value, lambda tensor: tensor.to(device))


def split_sequences(hidden: torch.Tensor, call: BlockCall, size: int) -> list[tuple[torch.Tensor, BlockCall]]:
    """A batch's hidden states (B, T, D) and its block call, cut into chunks of `size` sequences.

    A block treats its sequences independently, so running it chunk by chunk gives the whole
    batch's output with a chunk's intermediates. Every call tensor of two or more dimensions whose
    first is B (padding masks, per-sequence positions) is cut with the hidden states; the rest
    (rotary tables shared by the batch, 1-D cache positions, flags) goes to every chunk whole.
    Callers check once that this reproduces the whole batch (slicing's structure check)."""
    count = hidden.shape[0]
    if count <= size:
        return [(hidden, call)]

    def cut(value: Any, start: int) -> Any:
        if isinstance(value, torch.Tensor):
            return value[start : start + size] if value.dim() >= 2 and value.shape[0] == count else value
        if isinstance(value, tuple | list):
            return type(value)(cut(item, start) for item in value)
        if isinstance(value, dict):
            return {key: cut(item, start) for key, item in value.items()}
        return value

    return [(hidden[start : start + size], cut(call, start)) for start in range(0, count, size)]


def home_device(model: nn.Module) -> torch.device:
    """Where the model's parameters live (its first parameter's device)."""
    return next(model.parameters()).device


def layer_type_groups(model: PreTrainedModel, num_blocks: int) -> tuple[int, ...]:
    """Block index -> index of its layer type among the distinct types (in order of first use);
    () when every block has the same type (one call serves all)."""
    layer_types = getattr(model.config, "layer_types", None)
    if not isinstance(layer_types, list | tuple) or len(set(layer_types)) <= 1:
        return ()
    if len(layer_types) < num_blocks:
        raise ValueError(
            f"config.layer_types lists {len(layer_types)} types for {num_blocks} blocks; it must name "
            "one attention type per block"
        )
    order: dict[Any, int] = {}
    return tuple(order.setdefault(kind, len(order)) for kind in layer_types[:num_blocks])


class _Recording:
    """For one batch: block 0's hidden states and each layer type's call, filled by the recording
    forwards that replace the blocks' own while the batch runs (`recording`)."""

    def __init__(self, wanted: dict[int, int]) -> None:
        self.wanted = wanted  # the first block of each layer type -> its call's index
        self.last = max(wanted)
        self.hidden: torch.Tensor | None = None
        self.calls: list[BlockCall | None] = [None] * len(wanted)

    def forward_for(self, index: int) -> Any:
        def forward(*args: Any, **kwargs: Any) -> torch.Tensor:
            rest = dict(kwargs)
            hidden = args[0] if args else rest.pop("hidden_states")
            if index == 0:
                self.hidden = hidden
            if index in self.wanted:
                self.calls[self.wanted[index]] = (tuple(args[1:]), rest)
                if index == self.last:
                    raise _Captured
            return hidden

        return forward

    @contextmanager
    def recording(self, blocks: nn.ModuleList) -> Iterator[None]:
        """Every block's forward replaced by its recording one (an instance attribute shadows the
        class's forward; hooks and attributes stay), restored on exit."""
        for index, block in enumerate(blocks):
            block.forward = self.forward_for(index)
        try:
            yield
        finally:
            for block in blocks:
                del block.forward

    def complete(self) -> tuple[torch.Tensor, list[BlockCall]]:
        calls = [call for call in self.calls if call is not None]
        if self.hidden is None or len(calls) != len(self.calls):
            raise RuntimeError("the forward pass skipped a block the capture waited for")
        return self.hidden, calls


def calibration_keep(
    calibration_ids: torch.Tensor, attention_mask: torch.Tensor | None, batch_size: int
) -> torch.Tensor:
    """The (N, T) bool mask of real tokens on the CPU; ValueError for unusable calibration input."""
    if calibration_ids.dim() != 2:
        raise ValueError(f"calibration_ids must be (N, T), got shape {tuple(calibration_ids.shape)}")
    if attention_mask is None:
        attention_mask = torch.ones_like(calibration_ids)
    if attention_mask.shape != calibration_ids.shape:
        raise ValueError("attention_mask must have the shape of calibration_ids")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    keep = attention_mask.to(torch.bool).cpu()
    if not keep.any():
        raise ValueError("the calibration set has no unpadded token")
    return keep


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
    """Run each batch through the embeddings only; keep what the blocks would have received.

    `input_ids` and `keep` are (N, T); batches of `batch_size` rows run on `compute` and what they
    give the blocks is stored on `home`.
    """
    decoder = adapter.decoder(model)
    blocks = adapter.blocks(model)
    groups = layer_type_groups(model, len(blocks))
    wanted: dict[int, int] = {}  # the first block of each layer type -> its call's index
    for index, group in enumerate(groups or (0,)):
        if group not in wanted.values():
            wanted[index] = group
    # Everything the decoder owns before the blocks (embeddings, rotary tables...) goes to the
    # compute device; the blocks and the head stay home.
    front = [child for child in decoder.children() if child is not blocks]
    for module in front:
        module.to(compute)
    batches = []
    try:
        for start in range(0, input_ids.shape[0], batch_size):
            ids = input_ids[start : start + batch_size].to(compute)  # (B, T)
            mask = keep[start : start + batch_size]  # (B, T)
            recording = _Recording(wanted)
            try:
                with recording.recording(blocks):
                    model(
                        input_ids=ids,
                        attention_mask=mask.to(device=compute, dtype=torch.long),
                        use_cache=False,
                    )
            except _Captured:
                pass
            else:
                raise RuntimeError("the forward pass never reached every layer type's first block")
            hidden, calls = recording.complete()
            batches.append(BlockBatch(hidden.to(home), mask.to(home), move_to(calls, home), groups))
    finally:
        for module in front:
            module.to(home)
    return batches
