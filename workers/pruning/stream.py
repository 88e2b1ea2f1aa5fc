"""Calibration batches walked through the decoder one block at a time.

Every pruner here that needs data (Wanda, SparseGPT, layer drop, ShortGPT) works block by block:
the batches are run through the embeddings once (`workers.block_inputs`), then block i is called
on block i's inputs and its outputs replace them as block i+1's inputs. Only the block being
worked on moves to the compute device; activations stay where the model is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch import nn
from transformers import PreTrainedModel

from workers.architectures import FamilyAdapter
from workers.block_inputs import BlockBatch, capture_block_inputs, move_to

ProgressCallback = Callable[[int, int], None]  # (blocks done, number of blocks)
StopCheck = Callable[[], bool]  # True asks the engine to stop before the next block


class PruningStopped(RuntimeError):
    """should_stop() asked to stop. The model may be partly pruned and must be discarded."""


def check_calibration(calibration_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """The keep mask (N, T) bool on the CPU: False at padded positions. Raises ValueError on bad input."""
    if calibration_ids.dim() != 2:
        raise ValueError(f"calibration_ids must be (N, T), got shape {tuple(calibration_ids.shape)}")
    if attention_mask is None:
        attention_mask = torch.ones_like(calibration_ids)
    if attention_mask.shape != calibration_ids.shape:
        raise ValueError(
            f"attention_mask must have the shape of calibration_ids {tuple(calibration_ids.shape)}, "
            f"got {tuple(attention_mask.shape)}"
        )
    keep = attention_mask.to(torch.bool).cpu()  # (N, T)
    if not keep.any():
        raise ValueError("the calibration set has no unpadded token; send at least one real token")
    return keep


def capture(
    model: PreTrainedModel,
    adapter: FamilyAdapter,
    calibration_ids: torch.Tensor,
    keep: torch.Tensor,
    batch_size: int,
    compute: torch.device,
    home: torch.device,
) -> list[BlockBatch]:
    """Block 0's inputs for every calibration batch (kept on `home`)."""
    return capture_block_inputs(model, adapter, calibration_ids, keep, batch_size, compute, home)


@torch.no_grad()
def run_block(block: nn.Module, index: int, batch: BlockBatch, compute: torch.device) -> torch.Tensor:
    """Block `index`'s output hidden states (B, T, D) on `compute` for one batch."""
    hidden, (args, kwargs) = move_to((batch.hidden, batch.call(index)), compute)
    output = block(hidden, *args, **kwargs)
    return output[0] if isinstance(output, tuple) else output  # (B, T, D)


def stop_if_asked(should_stop: StopCheck | None, index: int, num_blocks: int) -> None:
    if should_stop is not None and should_stop():
        raise PruningStopped(
            f"stopped before block {index} of {num_blocks}; the model may be partly pruned and must be "
            "discarded"
        )


def walk_blocks(
    blocks: nn.ModuleList,
    *,
    compute: torch.device,
    home: torch.device,
    progress: ProgressCallback | None = None,
    should_stop: StopCheck | None = None,
) -> Iterator[tuple[int, nn.Module]]:
    """Yield (index, block moved to `compute`) for every block in order; the block goes back `home`
    once the caller's loop body is done with it.

    `progress(0, L)` first and `progress(i + 1, L)` after block i; `should_stop()` is checked before
    each block and raises PruningStopped.
    """
    num_blocks = len(blocks)
    if progress is not None:
        progress(0, num_blocks)
    for index in range(num_blocks):
        stop_if_asked(should_stop, index, num_blocks)
        yield index, blocks[index].to(compute)
        blocks[index].to(home)
        if progress is not None:
            progress(index + 1, num_blocks)


def token_rows(inputs: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A linear's input as (rows, features) without a copy, and which rows are unpadded tokens.

    Linears see (B, T, F) in most families and (B * T, F) where the block flattens first (OPT's MLP).
    """
    rows = inputs.reshape(-1, inputs.shape[-1])  # (B * T, F), a view
    flat_keep = keep.reshape(-1).to(rows.device)  # (B * T,)
    if rows.shape[0] != flat_keep.numel():
        raise RuntimeError(
            f"a linear saw {rows.shape[0]} token rows where the batch has {flat_keep.numel()} positions"
        )
    return rows, flat_keep


ROW_CHUNK_ELEMENTS = 1 << 20
"""Rows are converted to a statistic's precision this many elements at a time (8 MiB in float64):
no statistic copies a whole batch's (tokens x features) input (1.9 GB in float64 for Llama-3-8B's
down_proj on 8 x 2048 tokens)."""


def row_chunks(rows: torch.Tensor, keep: torch.Tensor | None, dtype: torch.dtype) -> Iterator[torch.Tensor]:
    """`rows` (n, F) in chunks of at most ROW_CHUNK_ELEMENTS elements, each a copy in `dtype` with
    the rows `keep` (n,) marks as padding set to zero (zero rows add nothing to a sum of squares or
    of outer products, so no selection copy is needed)."""
    step = max(1, ROW_CHUNK_ELEMENTS // max(1, rows.shape[-1]))
    for start in range(0, rows.shape[0], step):
        chunk = rows[start : start + step].to(dtype=dtype, copy=True)  # (step, F)
        if keep is not None:
            chunk[~keep[start : start + step]] = 0.0
        yield chunk


def add_squares(sums: torch.Tensor, rows: torch.Tensor, keep: torch.Tensor | None) -> None:
    """sums (F,) float64 += the sum over the real rows of `rows` (n, F) of x^2, per feature.

    Squared in float32 (or the rows' wider dtype) chunk by chunk and summed straight into float64
    (`sum(dtype=float64)`): converting every row to float64 first gave the same sums to about 1e-9
    relative at six times the cost, which in a Wanda prune or a profile is paid on every token of
    every distinct linear input."""
    for chunk in row_chunks(rows, keep, torch.promote_types(rows.dtype, torch.float32)):
        sums += chunk.square_().sum(dim=0, dtype=torch.float64)  # (F,)


def token_cosines(before: torch.Tensor, after: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """cos(before_t, after_t) for every unpadded token t, in float64: (n,)."""
    keep = keep.to(before.device)
    first = before[keep].double()  # (n, D)
    second = after[keep].double()  # (n, D)
    return torch.nn.functional.cosine_similarity(first, second, dim=-1, eps=1e-12)  # (n,)
