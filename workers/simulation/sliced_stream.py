"""A sequential basis stream run the way slicing runs its own calibration: at the sliced width.

A sequential stream's signals are the dense blocks run on projected inputs P x = x Q_d Q_dᵀ, whose
PCA gives the next basis (`workers.simulation.projection`). Run at full width, every block reads D
columns where slicing's passes read d (bench/README.md, `basis_windows.py`, has what each costs).
Here the stream holds x Q_d (B, T, d) between signals, and each block is a fused
copy whose readers W Q_d read d columns: its passes measure the same h and y the full-width stream
measured (the fused norm divides by D, the skip adds x Q_dᵀ back), and the copy is dropped once its
signals' bases are known. With every calibration window the bases are slicing's.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from workers.architectures import FamilyAdapter
from workers.block_inputs import BlockBatch
from workers.slicing.block_slicing import stream_rotation
from workers.slicing.fusion import fuse_block
from workers.slicing.pca import SecondMoment, principal_basis
from workers.slicing.portable.sliced_modules import ParallelSkipConnectedBlock, SkipConnectedBlock
from workers.slicing.portable.sliced_weights import set_weight_out_in, weight_out_in
from workers.slicing.report import BlockWidths
from workers.slicing.stream import NO_CALL, PassFunction, rewrite_stream


def enter_stream(
    batches: list[BlockBatch], full: int, width: int, centred: bool, compute: torch.device
) -> torch.Tensor:
    """The embedding signal's basis Q0 (D, D) float64, and the batches rotated onto its first `width`
    directions (B, T, width). LayerNorm families take Q0 from the centred signal, as slicing does after
    centring the embeddings; the kept directions are orthogonal to the mean, so x Q0[:, :d] drops it."""
    moment = SecondMoment(full, compute)
    for batch in batches:
        hidden = batch.hidden.to(compute)
        moment.add(hidden - hidden.mean(dim=-1, keepdim=True) if centred else hidden, batch.keep)
    basis = principal_basis(moment.matrix)[1]
    rotation = stream_rotation(basis, width, batches[0].hidden.dtype)
    for batch in batches:
        rewrite_stream(batch, width, rotation, chunk=batch.hidden.shape[0], compute=compute)
    return basis


def pass_block(
    adapter: FamilyAdapter,
    index: int,
    block: nn.Module,
    batches: list[BlockBatch],
    basis_in: torch.Tensor,
    widths: BlockWidths,
    full: int,
    compute: torch.device,
    chunk: int,
) -> tuple[torch.Tensor, ...]:
    """Advance a sliced stream through one dense `block` (on `compute`, left unchanged), `chunk`
    sequences at a time (slicing's `check_block_structure` says how many); the batches end at the
    block's output rotated onto its basis at widths.out. Returns the bases (D, D) float64 of the
    signals the block writes, in order (h then y; y alone for a parallel block).

    A fused copy of the block reads the stream through readers W Q[:, :d] and adds x Q[:, :d]ᵀ back,
    so each signal is measured at width D in the original basis: slicing's passes without its weight
    surgery (the writers are never rotated, and the readers in the stream's precision, not float64:
    that surgery cost more than the narrower readers saved, bench/README.md `basis_windows.py`)."""
    fused = copy.deepcopy(block)
    fuse_block(fused, adapter, full, compute)
    dtype = batches[0].hidden.dtype
    if adapter.is_parallel(fused):
        _rotate_readers(adapter.attn_readers(fused) + adapter.mlp_readers(fused), basis_in, widths.attn_in)
        parallel = ParallelSkipConnectedBlock(fused, adapter, skip=_back(basis_in, widths.attn_in, dtype))
        out = _measured_pass(batches, full, lambda h, a, k: parallel(h, *a, **k), chunk, compute, index)
        _rotate_stream(batches, out, widths.out, chunk, compute)
        return (out,)
    _rotate_readers(adapter.attn_readers(fused), basis_in, widths.attn_in)
    wrapper = SkipConnectedBlock(fused, adapter, attn_skip=_back(basis_in, widths.attn_in, dtype))

    def attention(hidden: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
        return wrapper.attention_residual(hidden, wrapper.call_arguments(hidden, args, kwargs))  # h

    mid = _measured_pass(batches, full, attention, chunk, compute, index)
    _rotate_readers(adapter.mlp_readers(fused), mid, widths.mlp_in)
    wrapper.set_skips(None, _back(mid, widths.mlp_in, dtype))
    to_mid = stream_rotation(mid, widths.mlp_in, dtype)

    def mlp(hidden: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
        return wrapper.mlp_residual(to_mid(hidden, args, kwargs))  # y from h Q_b[:, :d]

    out = _measured_pass(batches, full, mlp, chunk, compute, None)
    _rotate_stream(batches, out, widths.out, chunk, compute)
    return (mid, out)


def _measured_pass(
    batches: list[BlockBatch],
    full: int,
    function: PassFunction,
    chunk: int,
    compute: torch.device,
    index: int | None,
) -> torch.Tensor:
    """Every batch rewritten by `function` at width D (with block `index`'s call arguments, if any),
    and the principal basis (D, D) float64 of what it wrote."""
    moment = SecondMoment(full, compute)
    for batch in batches:
        call = batch.call(index) if index is not None else NO_CALL
        rewrite_stream(batch, full, function, chunk=chunk, compute=compute, call=call, moment=moment)
    return principal_basis(moment.matrix)[1]


def _rotate_stream(
    batches: list[BlockBatch], basis: torch.Tensor, width: int, chunk: int, compute: torch.device
) -> None:
    rotation = stream_rotation(basis, width, batches[0].hidden.dtype)
    for batch in batches:
        rewrite_stream(batch, width, rotation, chunk=chunk, compute=compute)


def _rotate_readers(readers: list[nn.Module], basis: torch.Tensor, width: int) -> None:
    """W <- W Q[:, :width], in the weight's dtype (float32 at least) on the compute device."""
    for reader in readers:
        weight = weight_out_in(reader)  # (out, D)
        compute = torch.promote_types(weight.dtype, torch.float32)
        rotated = weight.to(compute) @ basis[:, :width].to(device=weight.device, dtype=compute)
        set_weight_out_in(reader, rotated.to(weight.dtype))  # (out, width)


def _back(basis: torch.Tensor, width: int, dtype: torch.dtype) -> torch.Tensor:
    """Q[:, :width]ᵀ (width, D): the skip that adds the kept stream back in the original basis."""
    return basis[:, :width].T.to(dtype)
