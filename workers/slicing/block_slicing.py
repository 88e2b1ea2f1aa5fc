"""One block sliced, pass by pass, on its calibration stream (docs/science.md §1, steps 4-6 per
block): the principal basis of each residual signal the block writes, its readers rotated onto the
kept directions of its input, its writers rotated into the output's basis, and the stream rewritten
at the kept width for the next block. `workers.slicing.engine` runs these block after block.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from workers.allocator import release_free_memory
from workers.architectures import FamilyAdapter
from workers.block_inputs import BlockBatch as _Batch
from workers.slicing.pca import SecondMoment, principal_basis
from workers.slicing.portable.sliced_modules import BRANCHES, ParallelSkipConnectedBlock, SkipConnectedBlock
from workers.slicing.report import BlockWidths
from workers.slicing.rotation import rotate_branch_output, writers_in_frame
from workers.slicing.stream import PassFunction, rewrite_stream
from workers.slicing.weights import rotate_readers


def _rotation(basis: torch.Tensor, keep: int, dtype: torch.dtype) -> PassFunction:
    """The pass that rotates a stream of `dtype` onto `basis` and keeps `keep` directions:
    hidden @ Q[:, :keep] on Q's device, returned in hidden's dtype and device.

    In float32 (float64 for a float64 stream), not float64 like the weights: a product with an
    orthogonal matrix adds a relative error of about sqrt(D) float32 epsilons, far below what the
    stream's own dtype keeps, and float64 here cost 14 % of slicing's time. Q's kept columns are
    cast once per pass, not once per chunk."""
    compute = torch.promote_types(dtype, torch.float32)
    kept = basis[:, :keep].to(compute)  # (D, keep)

    def rotate(hidden: torch.Tensor, _args: tuple[Any, ...], _kwargs: dict[str, Any]) -> torch.Tensor:
        rotated = hidden.to(device=kept.device, dtype=compute) @ kept
        return rotated.to(device=hidden.device, dtype=hidden.dtype)

    return rotate


def _slice_sequential_block(
    adapter: FamilyAdapter,
    index: int,
    block: nn.Module,
    batches: list[_Batch],
    basis_in: torch.Tensor,
    widths: BlockWidths,
    full: int,
    compute: torch.device,
    dtype: torch.dtype,
    chunk: int,
) -> tuple[SkipConnectedBlock, torch.Tensor]:
    """Rotate and slice one fused sequential block in place (steps 4-6); advance every batch to the
    block's output in the new basis; return the block's skip-connected wrapper and that basis (Qc).

    Frames: each pass writes the residual at width D in the frame of its input's basis where the
    branch's writers can be rotated into it (`rotation.writers_in_frame`): h in Qa's frame, y in
    Qb's, so the kept input is the first columns of the sum and no skip product runs. Otherwise
    (a branch ending at a norm) it writes in the original basis through the skip Q[:, :d]^T."""
    d_in, d_mid, d_out = widths.attn_in, widths.mlp_in, widths.out
    # Until the block's output basis is known, its skips map back to the original basis.
    wrapper = SkipConnectedBlock(block, adapter, attn_skip=basis_in[:, :d_in].T.to(dtype))  # (d_in, D)
    rotate_readers(adapter.attn_readers(block), basis_in, d_in)  # steps 4 and 6: W @ Qa[:, :d]

    moment = SecondMoment(full, compute)
    with writers_in_frame(adapter, block, ("attention",), basis_in) as framed:

        def attention(hidden: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
            call = wrapper.call_arguments(hidden, args, kwargs)
            if framed:  # h @ Qa = [x, 0] + attn(norm(x)) @ Qa
                return _plus_kept(wrapper.attention_output(hidden, call), hidden)  # (S, T, D)
            return wrapper.attention_residual(hidden, call)  # h = x @ Qa[:, :d]^T + attn(norm(x))

        for batch in batches:
            rewrite_stream(
                batch, full, attention, chunk=chunk, compute=compute, call=batch.call(index), moment=moment
            )
    release_free_memory()  # the pass's activations are freed
    # Step 5 on h, then steps 4 and 6 for the attention writers, the MLP readers and the skip.
    mid_local, basis_mid = _principal_in_frame(moment, basis_in if framed else None)  # Qb
    rotate_branch_output(adapter, block, "attention", basis_mid, d_mid)
    rotate_readers(adapter.mlp_readers(block), basis_mid, d_mid)
    attn_skip = basis_in[:, :d_in].T @ basis_mid[:, :d_mid]  # (d_in, d_mid)
    wrapper.set_skips(attn_skip.to(dtype), basis_mid[:, :d_mid].T.to(dtype))  # MLP skip (d_mid, D) for now

    moment = SecondMoment(full, compute)
    to_mid = _rotation(mid_local, d_mid, dtype)  # h @ Qb[:, :d_mid], whichever frame h is in
    with writers_in_frame(adapter, block, ("mlp",), basis_mid) as framed:

        def mlp(hidden: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
            kept = to_mid(hidden, args, kwargs)  # (S, T, d_mid)
            if framed:
                return _plus_kept(wrapper.mlp_output(kept), kept)  # y @ Qb, (S, T, D)
            return wrapper.mlp_residual(kept)  # y in the original basis

        for batch in batches:
            rewrite_stream(batch, full, mlp, chunk=chunk, compute=compute, moment=moment)
    release_free_memory()
    # Step 5 on y, then steps 4 and 6 for the MLP writers, the skip and the stream.
    out_local, basis_out = _principal_in_frame(moment, basis_mid if framed else None)  # Qc
    rotate_branch_output(adapter, block, "mlp", basis_out, d_out)
    mlp_skip = basis_mid[:, :d_mid].T @ basis_out[:, :d_out]  # (d_mid, d_out)
    wrapper.set_skips(attn_skip.to(dtype), mlp_skip.to(dtype))
    rotation = _rotation(out_local, d_out, dtype)
    for batch in batches:  # (B, T, d_out): the next block's input
        rewrite_stream(batch, d_out, rotation, chunk=chunk, compute=compute)
    return wrapper, basis_out


def _slice_parallel_block(
    adapter: FamilyAdapter,
    index: int,
    block: nn.Module,
    batches: list[_Batch],
    basis_in: torch.Tensor,
    widths: BlockWidths,
    full: int,
    compute: torch.device,
    dtype: torch.dtype,
    chunk: int,
) -> tuple[ParallelSkipConnectedBlock, torch.Tensor]:
    """Steps 4-6 for a parallel-residual block: one input basis Qa, one output basis Qc, one skip
    S = Qa[:, :d]^T Qc[:, :d]; attention and MLP readers both take W @ Qa. The pass writes y in
    Qa's frame where both branches' writers can be rotated into it, as in sequential blocks."""
    d_in, d_out = widths.attn_in, widths.out
    wrapper = ParallelSkipConnectedBlock(block, adapter, skip=basis_in[:, :d_in].T.to(dtype))  # (d_in, D)
    rotate_readers(adapter.attn_readers(block) + adapter.mlp_readers(block), basis_in, d_in)  # steps 4, 6

    moment = SecondMoment(full, compute)
    with writers_in_frame(adapter, block, BRANCHES, basis_in) as framed:

        def forward(hidden: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
            if framed:  # y @ Qa = [x, 0] + (attn + mlp) @ Qa
                call = wrapper.call_arguments(hidden, args, kwargs)
                return _plus_kept(wrapper.branches_output(hidden, call), hidden)  # (S, T, D)
            return wrapper(hidden, *args, **kwargs)  # (S, T, D), original basis

        for batch in batches:
            rewrite_stream(
                batch, full, forward, chunk=chunk, compute=compute, call=batch.call(index), moment=moment
            )
    release_free_memory()
    # Step 5 on y, then steps 4 and 6 for both branches' writers, the skip and the stream.
    out_local, basis_out = _principal_in_frame(moment, basis_in if framed else None)  # Qc
    rotate_branch_output(adapter, block, "attention", basis_out, d_out)
    rotate_branch_output(adapter, block, "mlp", basis_out, d_out)
    wrapper.set_skip((basis_in[:, :d_in].T @ basis_out[:, :d_out]).to(dtype))  # (d_in, d_out)
    rotation = _rotation(out_local, d_out, dtype)
    for batch in batches:  # (B, T, d_out): the next block's input
        rewrite_stream(batch, d_out, rotation, chunk=chunk, compute=compute)
    return wrapper, basis_out


def _principal_in_frame(
    moment: SecondMoment, frame: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(V, Q): the principal basis of a stream accumulated in the frame of `frame` (None: the
    original basis), as coordinates in that frame (V, which rotates the stream) and in the original
    basis (Q = frame @ V, which rotates the weights). Both (D, D) float64."""
    _, local = principal_basis(moment.matrix)
    return local, local if frame is None else frame @ local


def _plus_kept(branches: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """branches + [kept, 0]: the residual sum in a frame whose first columns the kept stream is."""
    branches[..., : kept.shape[-1]] += kept
    return branches
