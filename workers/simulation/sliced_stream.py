"""A sequential basis stream run the way slicing runs its own calibration: at the sliced width.

A sequential stream's signals are the dense blocks run on projected inputs P x = x Q_d Q_dᵀ, whose
PCA gives the next basis (`workers.simulation.projection`). Run at full width, every block reads D
columns where slicing's passes read d, and the stream cost 1.05x slicing's own passes (bench/README.md,
`basis_windows.py`). Here the stream holds x Q_d (B, T, d) between signals, and each block is a fused
copy sliced by slicing's own step (`workers.slicing.block_slicing.slice_block`) on the stream's
windows: its readers W Q_d read d columns, its passes measure the same h and y the full-width stream
measured (the fused norm divides by D, the skip adds x Q_dᵀ back), and the copy is dropped once its
signals' bases are known. With every calibration window the bases are slicing's bases, computed by
slicing's code.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from workers.architectures import FamilyAdapter
from workers.block_inputs import BlockBatch
from workers.slicing.block_slicing import slice_block, stream_rotation
from workers.slicing.fusion import fuse_block
from workers.slicing.pca import SecondMoment, principal_basis
from workers.slicing.report import BlockWidths
from workers.slicing.stream import rewrite_stream


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
    """Advance a sliced stream through one dense `block` (on `compute`, left unchanged): a fused copy
    of it is sliced on the stream's batches, `chunk` sequences at a time (slicing's
    `check_block_structure` says how many), which end at the block's output rotated onto its basis.
    Returns the bases (D, D) float64 of the signals the block writes, in order (h then y; y alone for
    a parallel block)."""
    fused = copy.deepcopy(block)
    fuse_block(fused, adapter, full, compute)
    dtype = batches[0].hidden.dtype
    sliced = slice_block(adapter, index, fused, batches, basis_in, widths, full, compute, dtype, chunk)
    return sliced.bases
