"""The calibration stream, rewritten in place pass after pass.

Slicing keeps every calibration batch's hidden states from one pass to the next: at width d between
blocks, at D inside one. Replacing each batch's tensor by a new one at every pass held both for a
while and, freed out of order, fragmented the heap (docs/architecture.md, "Memory"). Here each batch
keeps the buffer its hidden states were captured in (B x T x D) for the whole run: a pass computes a
few sequences at a time and writes them back into that buffer as the new (B, T, width) tensor, laid
out contiguously from its start. A pass that widens the stream walks the chunks from the last to the
first and one that narrows it from the first, so no chunk is overwritten before it is read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from workers.block_inputs import BlockBatch, BlockCall, move_to, split_sequences
from workers.slicing.pca import SecondMoment

# (hidden chunk (S, T, w_in), its call's args, kwargs) on the compute device -> (S, T, width)
PassFunction = Callable[[torch.Tensor, tuple[Any, ...], dict[str, Any]], torch.Tensor]
NO_CALL: BlockCall = ((), {})


def _buffer(hidden: torch.Tensor, needed: int) -> torch.Tensor:
    """The flat buffer behind `hidden` when it starts there and holds `needed` elements, else a new
    one (then nothing overlaps and any order is safe)."""
    capacity = hidden.untyped_storage().nbytes() // hidden.element_size()
    if hidden.is_contiguous() and hidden.storage_offset() == 0 and capacity >= needed:
        return hidden.as_strided((capacity,), (1,), 0)
    return torch.empty(needed, dtype=hidden.dtype, device=hidden.device)


def rewrite_stream(
    batch: BlockBatch,
    width: int,
    function: PassFunction,
    *,
    chunk: int,
    compute: torch.device,
    call: BlockCall = NO_CALL,
    moment: SecondMoment | None = None,
) -> None:
    """batch.hidden <- function(batch.hidden), `chunk` sequences at a time on `compute`, written into
    the batch's own buffer; `moment`, if given, accumulates every output chunk (its padded positions
    left out)."""
    hidden = batch.hidden  # (B, T, w_in) on the home device
    count, length, width_in = hidden.shape
    buffer = _buffer(hidden, count * length * max(width, width_in))
    pieces = split_sequences(hidden, call, chunk)
    starts = [0]
    for part, _ in pieces[:-1]:
        starts.append(starts[-1] + part.shape[0])
    order = range(len(pieces)) if width <= width_in else range(len(pieces) - 1, -1, -1)
    for index in order:
        part, part_call = pieces[index]
        rows, start = part.shape[0], starts[index]
        on_compute, (args, kwargs) = move_to((part, part_call), compute)
        out = function(on_compute, args, kwargs)  # (rows, T, width)
        if moment is not None:
            moment.add(out, batch.keep[start : start + rows])
        buffer[start * length * width : (start + rows) * length * width].copy_(out.reshape(-1))
    batch.hidden = buffer[: count * length * width].view(count, length, width)
