"""SliceGPT in the per-layer layout: `slice_model` slices the residual stream of a model in place, each
signal onto its own basis, block by block. The file reads in the order slicing runs.

SliceGPT's steps, numbered as every module of `workers.slicing` numbers them:

1. untie the LM head from the token embedding, so that each can be rotated on its own
   (`fusion.untie_head`);
2. LayerNorm models: remove the stream's mean, by centring the embedding rows and every residual
   writer (`fusion.fuse_embeddings`, `fusion.fuse_block`);
3. fold every norm's scale (and shift) into the linears that read it, leaving weight-free
   `RMSNormNoScale`s (`fusion.fuse_block`, `fusion.fuse_final_norm`). After steps 1-3 the model
   computes the same logits whatever orthogonal Q its stream is rotated by (computational
   invariance);
4. rotate the stream by Q: readers W @ Q, writers Q^T W, embeddings E @ Q, head W @ Q (`weights`;
   `rotation.rotate_fused_model` rotates a whole fused model by one Q, the check of steps 1-4);
5. PCA: each signal's Q, the eigenvectors of the second moment of its calibration activations
   (`pca`);
6. slice: keep Q's first d columns, so that readers keep d input columns, writers d output rows and
   the tables d columns, and a skip Q_in[:, :d]^T Q_out[:, :d] carries the stream from one signal's
   basis to the next (this module, and per block `workers.slicing.block_slicing`).

`slice_model` runs them signal by signal, in five stages, each named in a comment where it runs:

- embeddings (steps 1-2): detect the family (module structure); for LayerNorm models untie the
  head and centre the embeddings (an RMSNorm model's head stays tied until the head stage);
- capture: run the calibration batches up to block 0 and keep block 0's inputs (on the model's
  device; `workers.block_inputs`);
- embedding basis (steps 5-6): PCA of the embedding output -> Q0; block 0's inputs x @ Q0[:, :d];
- blocks (steps 2-6 per block): for each block, with input basis Qa (only this block is on the
  compute device): fold its norms; attention readers W @ Qa (d input columns); run attention with
  the skip Qa[:, :d]^T, giving the residual h in the original basis; PCA(h) -> Qb; attention
  writers Qb^T W (d rows); MLP readers W @ Qb; run the MLP with the skip Qb[:, :d]^T, giving the
  block output y; PCA(y) -> Qc; MLP writers Qc^T W (d rows); (a branch that ends at a norm,
  Gemma's, keeps its writers and that norm at width D and projects after the norm instead,
  `sliced_modules.ProjectedRMSNorm`); the block's skips become S_attn = Qa[:, :d]^T Qb[:, :d] and
  S_mlp = Qb[:, :d]^T Qc[:, :d]; the next block's inputs are y @ Qc[:, :d], so slicing errors
  upstream feed every later PCA. Parallel-residual blocks (y = x + attn(x) + mlp(x)) have only Qa
  and Qc and one skip S = Qa[:, :d]^T Qc[:, :d]. The passes that measure h and y write them in the
  frame of their input's basis (h @ Qa, y @ Qb) where the branch's writers can be rotated into it
  for the pass, which spares the skip product (`block_slicing._slice_sequential_block`,
  "Frames"); the weights are rotated as described either way;
- head and tables (steps 1, 3, 4, 6), once the calibration stream is freed: fold the final norm
  into the head (which unties it) and rotate it, W_head diag(scale) Q_L, in one copy; then the
  embedding tables E @ Q0, keeping d columns. By default the head is not sliced: the last block
  writes all D rows and its MLP skip is d x D.

PCA and weight rotations run in float64; results are cast back to the model's dtype. What slicing
reports (widths, parameters, calibration, timings, kept directions): `workers.slicing.report`.

Peak memory beyond the loaded model (docs/architecture.md, "Memory"), for N calibration sequences
of T tokens, hidden width D, MLP width F, vocabulary V and model dtype size b:
  the stream, N T D b: each batch keeps the buffer it was captured in and every pass writes its
  output back into it (`stream.rewrite_stream`), so the stream never exists twice;
  one chunk's pass intermediates, about ACTIVATION_ROWS (6 D + 3 F) b: passes run a few sequences
  at a time;
  float64 work: a row chunk of a weight (2 ROW_CHUNK x max(D, F) x 8), a moment chunk
  (MOMENT_ROWS x D x 8) and a few D x D matrices (moment, eigenvectors, bases);
  during one pass, a branch's writers rotated into the input's frame beside their originals
  (at most D x max(D, F) b per writer);
  after the stream is freed, for the head and tables: the new head (V x D, folded and rotated in
  one copy beside the tied table) and then the rotated table V x d, each replacing its weight
  when made;
  with `keep_bases`, the report's (L + 1) D x d float32 bases.
Between passes the freed heap pages go back to the system (`allocator.release_free_memory`).
Measured on SmolLM2-135M at 128 x 512: 1.20-1.25 x (model + stream) above the runtime's own
memory, the peak in the block passes (bench/README.md, "slicing_vs_reference.py").
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from core.families import head_must_be_sliced, head_sliced_by_default, unsupported_message
from core.param_count import predict_dense_param_count, predict_sliced_param_count, sliced_width
from workers.allocator import release_free_memory
from workers.architectures import FamilyAdapter, UnsupportedArchitectureError, config_dict, detect_family
from workers.block_inputs import BlockBatch as _Batch
from workers.block_inputs import BlockCall, ProgressCallback, StopCheck, calibration_keep, split_sequences
from workers.block_inputs import capture_block_inputs as _capture_block_inputs
from workers.block_inputs import home_device as _home_device
from workers.block_inputs import move_to as _move
from workers.slicing.block_slicing import _rotation, _slice_parallel_block, _slice_sequential_block
from workers.slicing.fusion import fuse_block, fuse_embeddings, fuse_final_norm, hidden_width
from workers.slicing.pca import SecondMoment, principal_basis
from workers.slicing.portable.sliced_modules import RMSNormNoScale, wrap_block
from workers.slicing.report import SlicedWidths, SlicingReport, kept_directions
from workers.slicing.stream import PassFunction, rewrite_stream
from workers.slicing.weights import rotate_embedding

# Positions a block's passes run at once (whole sequences, at least one): attention's and the MLP's
# intermediates stay a few MB whatever the calibration batch.
ACTIVATION_ROWS = 1024


class SlicingStopped(RuntimeError):
    """should_stop() asked to stop. The model is partly sliced and must be discarded."""


@torch.no_grad()
def slice_model(
    model: PreTrainedModel,
    calibration_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    sparsity: float,
    *,
    round_to: int = 8,
    batch_size: int = 8,
    device: torch.device | str | None = None,
    slice_head: bool | None = None,
    keep_bases: bool = True,
    progress: ProgressCallback | None = None,
    should_stop: StopCheck | None = None,
) -> SlicingReport:
    """Slice the residual stream of `model` in place to d = floor((1 - sparsity) * D) (rounded down
    to a multiple of `round_to`) with SliceGPT, calibrated on `calibration_ids` (N, T).

    `attention_mask` (N, T) marks real tokens with 1 (None: all real); padded positions are kept
    out of every PCA. Only one block at a time is moved to `device` (default: where the model is);
    calibration activations stay where the model is, in the model's dtype. `slice_head` None keeps
    the LM head at full width D except for families whose forward needs it sliced (GPT-2).
    `keep_bases` keeps the kept directions of every block-boundary signal in the report (probes
    compare the sliced blocks through them): (L + 1) D x d float32 on the CPU.

    `progress(blocks_done, num_blocks)` is called once with 0 first and then after each block.
    `should_stop()` is checked before each block; when it returns True, SlicingStopped is raised
    and the partly sliced model must be discarded. Unsupported models raise
    UnsupportedArchitectureError before any weight changes meaning (at most the head is untied
    and the embeddings centred, which keeps the logits).
    """
    started = time.perf_counter()
    keep = calibration_keep(calibration_ids, attention_mask, batch_size)
    adapter = detect_family(model)
    if is_fused(model, adapter):
        raise ValueError("the model is already fused or sliced; slice the original dense model")
    slice_head = resolve_slice_head(adapter.name, slice_head)
    model.eval()
    dense_config = model.config.to_dict()
    full = hidden_width(model, adapter)
    width = sliced_width(full, sparsity, round_to)
    home = _home_device(model)
    compute = torch.device(device) if device is not None else home
    dtype = adapter.embeddings(model)[0].weight.dtype
    params_before = count_parameters(model)
    blocks = adapter.blocks(model)
    widths = SlicedWidths.uniform(full, width, len(blocks), slice_head)
    timings: dict[str, Any] = {"blocks": []}

    # Embeddings (steps 1-2): a LayerNorm model's head untied and its embedding rows centred.
    fuse_embeddings(model, adapter, compute)
    # Capture: what block 0 receives from every calibration batch, kept where the model lives.
    batches = _capture_block_inputs(model, adapter, calibration_ids, keep, batch_size, compute, home)
    blocks[0].to(compute)
    chunk = _check_block_structure(model, adapter, blocks[0], batches[0], compute)
    release_free_memory()
    timings["capture"] = time.perf_counter() - started
    # Embedding basis (steps 5-6): Q0, and block 0's inputs rotated onto it and sliced.
    embedding_basis = _stream_basis(batches, full, widths.embedding, compute, chunk)
    release_free_memory()
    bases = [kept_directions(embedding_basis, widths.embedding)] if keep_bases else None
    # Blocks (steps 2-6 per block), one on the compute device at a time.
    basis = _slice_blocks(
        adapter,
        blocks,
        batches,
        embedding_basis,
        widths,
        full,
        compute,
        home,
        dtype,
        chunk,
        timings,
        progress,
        should_stop,
        bases,
    )
    batches.clear()  # the activations are spent; free them before the tables' large temporaries
    release_free_memory()
    head_started = time.perf_counter()
    # Head and tables (steps 1, 3, 4, 6). Unties, folds and rotates the head in one copy: first,
    # while the table is dense.
    fuse_final_norm(model, adapter, full, compute, rotation=basis[:, : widths.head])
    for embedding in adapter.embeddings(model):
        rotate_embedding(embedding, embedding_basis, widths.embedding)
    timings["head"] = time.perf_counter() - head_started
    timings["total"] = time.perf_counter() - started
    predicted_before, predicted_after = _predicted_counts(dense_config, width, slice_head)
    return SlicingReport(
        family=adapter.name,
        hidden_size=full,
        sparsity=sparsity,
        round_to=round_to,
        slice_head=slice_head,
        widths=widths,
        params_before=params_before,
        params_after=count_parameters(model),
        predicted_params_before=predicted_before,
        predicted_params_after=predicted_after,
        calibration_sequences=int(calibration_ids.shape[0]),
        calibration_tokens=int(keep.sum()),
        device=str(compute),
        dtype=str(dtype).removeprefix("torch."),
        timings=timings,
        bases=bases,
    )


def is_fused(model: PreTrainedModel, adapter: FamilyAdapter) -> bool:
    """True once any norm was folded away (a fused or sliced model)."""
    norms = [adapter.final_norm(model)]
    for block in adapter.blocks(model):
        norms += [adapter.attn_norm(block), adapter.mlp_norm(block)]
    return any(isinstance(norm, RMSNormNoScale) for norm in norms)


def resolve_slice_head(family: str, slice_head: bool | None) -> bool:
    """None: the family's default; refuses an unsliced head where the family's forward needs one."""
    if slice_head is None:
        return head_sliced_by_default(family)
    if not slice_head and head_must_be_sliced(family):
        raise ValueError(
            f"{family} models need a sliced LM head: their forward reshapes the final stream "
            "to the embedding width; pass slice_head=True or None"
        )
    return slice_head


def count_parameters(model: nn.Module) -> int:
    """Unique parameters (shared ones counted once)."""
    return sum(parameter.numel() for parameter in model.parameters())


@torch.no_grad()
def _check_block_structure(
    model: PreTrainedModel, adapter: FamilyAdapter, block: nn.Module, batch: _Batch, compute: torch.device
) -> int:
    """The adapter's residual structure must reproduce the block's own forward exactly (checked on
    the first two sequences). Returns how many sequences the passes may run at once: a chunk of
    about ACTIVATION_ROWS positions when running the block sequence by sequence reproduces the
    pair, else the whole batch."""
    hidden, call = _move((batch.hidden, batch.call(0)), compute)
    whole = hidden.shape[0]
    chunk = max(1, ACTIVATION_ROWS // hidden.shape[1])
    pair, (args, kwargs) = split_sequences(hidden, call, 2)[0]
    wrapper = wrap_block(block, adapter)
    expected = block(pair, *args, **kwargs)
    expected = expected[0] if isinstance(expected, tuple) else expected
    actual = wrapper(pair, *args, **kwargs)
    tolerance = 1e-5 if hidden.dtype in (torch.float32, torch.float64) else 1e-2
    error = _relative_error(actual, expected)
    if not error <= tolerance:
        raise UnsupportedArchitectureError(
            unsupported_message(
                config_dict(model),
                f"its blocks compute something the {adapter.name} adapter's residual structure does not "
                f"reproduce (relative error {error:.2g}; e.g. scaled residual branches)",
            )
        )
    if chunk >= whole or pair.shape[0] < 2:
        return whole
    try:
        one_by_one = _by_sequences(lambda h, a, k: wrapper(h, *a, **k), pair, (args, kwargs), 1)
    except (IndexError, RuntimeError, TypeError):  # a call argument this model's blocks cannot cut
        return whole
    return chunk if _relative_error(one_by_one, actual) <= tolerance else whole


def _relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    expected64 = expected.double()
    return float((actual.double() - expected64).norm() / expected64.norm().clamp_min(1e-30))


def _by_sequences(
    function: PassFunction,
    hidden: torch.Tensor,
    call: BlockCall,
    size: int,
) -> torch.Tensor:
    """function(hidden, args, kwargs) over a batch, run on chunks of `size` sequences
    (`block_inputs.split_sequences`) and put back together: the whole batch's result with one
    chunk's intermediates (attention's q/k/v, an MLP's (rows, F) activations)."""
    parts = [function(part, args, kwargs) for part, (args, kwargs) in split_sequences(hidden, call, size)]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _stream_basis(
    batches: list[_Batch],
    full: int,
    width: int,
    compute: torch.device,
    chunk: int,
) -> torch.Tensor:
    """The principal basis Q0 of what block 0 reads; block 0's inputs are rotated onto it and keep
    `width` columns. The embedding tables are rotated to match only once the stream is freed, at
    the end (`slice_model`): their rotated copies then never coexist with it. Returns Q0 (D, D)
    float64."""
    moment = SecondMoment(full, compute)
    for batch in batches:
        moment.add(batch.hidden, batch.keep)
    _, basis = principal_basis(moment.matrix)  # step 5
    rotation = _rotation(basis, width, batches[0].hidden.dtype)  # steps 4 and 6 on the stream
    for batch in batches:
        rewrite_stream(batch, width, rotation, chunk=chunk, compute=compute)  # (B, T, d)
    return basis


def _slice_blocks(
    adapter: FamilyAdapter,
    blocks: nn.ModuleList,
    batches: list[_Batch],
    basis: torch.Tensor,
    widths: SlicedWidths,
    full: int,
    compute: torch.device,
    home: torch.device,
    dtype: torch.dtype,
    chunk: int,
    timings: dict[str, Any],
    progress: ProgressCallback | None,
    should_stop: StopCheck | None,
    bases: list[torch.Tensor] | None,
) -> torch.Tensor:
    """Slice every block in order, one on `compute` at a time, appending each block's kept output
    directions to `bases` unless it is None; each pass runs `chunk` sequences at a time. Returns the
    last block's output basis."""
    num_blocks = len(blocks)
    if progress is not None:
        progress(0, num_blocks)
    for index, block_widths in enumerate(widths.blocks):
        if should_stop is not None and should_stop():
            raise SlicingStopped(
                f"stopped before block {index} of {num_blocks}; "
                "the model is partly sliced and must be discarded"
            )
        block_started = time.perf_counter()
        block = blocks[index].to(compute)
        fuse_block(block, adapter, full, compute)  # steps 2-3: writers centred, norms folded
        slice_block = _slice_parallel_block if adapter.is_parallel(block) else _slice_sequential_block
        blocks[index], basis = slice_block(
            adapter, index, block, batches, basis, block_widths, full, compute, dtype, chunk
        )
        if bases is not None:
            bases.append(kept_directions(basis, block_widths.out))
        blocks[index].to(home)
        timings["blocks"].append(time.perf_counter() - block_started)
        if progress is not None:
            progress(index + 1, num_blocks)
    return basis


def _predicted_counts(
    dense_config: dict[str, Any], width: int, slice_head: bool
) -> tuple[int | None, int | None]:
    """The parameter counts core.param_count predicts before and after, or None for a structurally
    recognised model_type without a formula."""
    try:
        return (
            predict_dense_param_count(dense_config),
            predict_sliced_param_count(dense_config, width, slice_head=slice_head),
        )
    except (KeyError, TypeError, ValueError):
        return None, None
