"""Weight surgery on the modules that read or write the residual stream: SliceGPT's steps 4 (rotate)
and 6 (slice), as `workers.slicing.engine` numbers them.

Conventions: the residual stream is a row vector h of width D; a linear reading it computes
h @ W.T + b with W stored [out, in] (nn.Linear; GPT-2's Conv1D stores W.T and is handled here so
no caller cares). A rotation Q (D x D, orthogonal, columns sorted by importance) changes the
stream to h @ Q, so:
- a reader's weight becomes W @ Q, and keeps the first d input columns when sliced;
- a writer's weight becomes Q.T @ W and its bias b @ Q, keeping the first d output rows;
- an embedding table E (rows are stream vectors) becomes E @ Q, keeping d columns;
- a norm on a branch's output (scale a) becomes a `ProjectedRMSNorm` with P = diag(a) Q[:, :d],
  and the writers before it keep their D rows.
All arithmetic runs in float64 on the device of Q, on chunks of ROW_CHUNK rows (or columns, for
column-independent maps), so no whole-matrix float64 copy exists; results are cast back to the
parameter's dtype and stored where the parameter was.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from workers.slicing.portable.sliced_modules import ProjectedRMSNorm, norm_epsilon
from workers.slicing.portable.sliced_weights import (
    bias_of,
    set_bias,
    set_embedding,
    set_weight_out_in,
    tensor_of,
    weight_out_in,
)

# Rows per float64 chunk when transforming row-independent matrices. A 49152 x 576 head or
# embedding would otherwise need two float64 copies (~450 MB) at once; chunks bound that to ~19 MB
# (2 x 2048 x 576 x 8 bytes), ~270 MB for a 2048-row chunk at D = 8192.
ROW_CHUNK = 2048


def _f64(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    return tensor.detach().to(device=device, dtype=torch.float64)


def _map_rows(
    matrix: torch.Tensor, transform: Callable[[torch.Tensor], torch.Tensor], device: torch.device
) -> torch.Tensor:
    """transform() applied in float64 on `device` to row chunks of `matrix`; the result is
    assembled in `matrix`'s dtype and device, so no full-size float64 copy ever exists."""
    result: torch.Tensor | None = None
    for start in range(0, matrix.shape[0], ROW_CHUNK):
        piece = transform(_f64(matrix[start : start + ROW_CHUNK], device))  # (rows, cols), float64
        if result is None:
            result = torch.empty((matrix.shape[0], piece.shape[1]), dtype=matrix.dtype, device=matrix.device)
        result[start : start + piece.shape[0]] = piece.to(device=matrix.device, dtype=matrix.dtype)
    assert result is not None, "empty matrix"
    return result


def fold_norm_into_readers(
    readers: list[nn.Module],
    scale: torch.Tensor | None,
    shift: torch.Tensor | None,
    device: torch.device,
    rotation: torch.Tensor | None = None,
) -> None:
    """W <- W diag(scale) R; b <- b + W_orig @ shift (a reader without bias gains one if shift
    exists). `rotation` R (D, keep), float64 on `device`, defaults to the identity: given, the fold
    and the rotation make one new weight, so no folded-only copy of a large reader (the head) is
    ever held beside the rotated one."""
    scale64 = None if scale is None else _f64(scale, device)[None, :]  # (1, D)

    def transform(rows: torch.Tensor) -> torch.Tensor:
        scaled = rows if scale64 is None else rows * scale64
        return scaled if rotation is None else scaled @ rotation

    for reader in readers:
        weight = weight_out_in(reader)  # (out, D)
        if shift is not None:
            shift64 = _f64(shift, device)
            bias = torch.cat([_f64(rows, device) @ shift64 for rows in weight.split(ROW_CHUNK)])  # (out,)
            old_bias = bias_of(reader)
            if old_bias is not None:
                bias = bias + _f64(old_bias, device)
            set_bias(reader, bias, like=tensor_of(reader, "weight"))
        if scale64 is not None or rotation is not None:
            set_weight_out_in(reader, _map_rows(weight, transform, device))


def _map_columns(
    matrix: torch.Tensor, transform: Callable[[torch.Tensor], torch.Tensor], device: torch.device
) -> torch.Tensor:
    """The same for column-independent transforms: transform() maps chunks of columns, each given
    as rows (columns, D) of the transpose, and the result is assembled back as (rows, columns)."""
    return _map_rows(matrix.t(), transform, device).t().contiguous()


def centre_writer(writer: nn.Module, device: torch.device) -> None:
    """Subtract from each column its mean over the output rows (and the bias' mean), so that
    everything the module adds to the residual stream has zero mean across features."""
    centred = _map_columns(weight_out_in(writer), lambda cols: cols - cols.mean(dim=1, keepdim=True), device)
    set_weight_out_in(writer, centred)  # (D, in)
    old_bias = bias_of(writer)
    if old_bias is not None:
        bias = _f64(old_bias, device)
        set_bias(writer, bias - bias.mean(), like=old_bias)


def centre_embedding(embedding: nn.Embedding, device: torch.device) -> None:
    centred = _map_rows(embedding.weight, lambda rows: rows - rows.mean(dim=1, keepdim=True), device)
    set_embedding(embedding, centred)  # (rows, D)


def rotate_readers(readers: list[nn.Module], basis: torch.Tensor, keep: int) -> None:
    """W <- W @ Q[:, :keep] for every reader; Q is float64 on the compute device."""
    for reader in readers:
        rotated = _map_rows(weight_out_in(reader), lambda rows: rows @ basis[:, :keep], basis.device)
        set_weight_out_in(reader, rotated)  # (out, keep)


def rotate_writers(writers: list[nn.Module], basis: torch.Tensor, keep: int) -> None:
    """W <- (Q.T @ W)[:keep] and b <- (b @ Q)[:keep] for every writer."""
    for writer in writers:
        rotated = _map_columns(weight_out_in(writer), lambda cols: cols @ basis[:, :keep], basis.device)
        set_weight_out_in(writer, rotated)  # (keep, in)
        old_bias = bias_of(writer)
        if old_bias is not None:
            set_bias(writer, _f64(old_bias, basis.device) @ basis[:, :keep], like=old_bias)


def rotate_embedding(embedding: nn.Embedding, basis: torch.Tensor, keep: int) -> None:
    rotated = _map_rows(embedding.weight, lambda rows: rows @ basis[:, :keep], basis.device)
    set_embedding(embedding, rotated)  # (rows, keep)


def project_output_norm(
    norm: nn.Module, scale: torch.Tensor | None, basis: torch.Tensor, keep: int
) -> ProjectedRMSNorm:
    """The `ProjectedRMSNorm` replacing a branch-output norm of scale `scale` (None: 1): its
    projection diag(scale) Q[:, :keep] (D, keep), computed in float64, stored in the norm's dtype."""
    like = next(norm.parameters(), None)
    dtype = like.dtype if like is not None else torch.float32
    projection = basis[:, :keep]
    if scale is not None:
        projection = _f64(scale, basis.device)[:, None] * projection  # (D, keep)
    device = like.device if like is not None else basis.device
    return ProjectedRMSNorm(projection.to(device=device, dtype=dtype), norm_epsilon(norm))
