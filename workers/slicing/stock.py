"""SliceGPT in the stock layout: one basis Q shared by every residual signal.

With one basis, every skip matrix Q[:, :d]^T Q[:, :d] is the identity, so the sliced model needs no
module that stock transformers lacks: it *is* the dense architecture with `hidden_size = d`
(`core.param_count.stock_config`), saved with `save_pretrained` and loaded anywhere with
`AutoModelForCausalLM.from_pretrained`. One basis must serve signals whose principal directions
drift with depth; docs/science.md (stock layout) says how the basis is chosen and how it measured
against the per-layer layout.

`slice_model_stock` modifies the model in place:

1. one dense pass, block by block (one block on the compute device at a time, calibration
   activations where the model lives, as in `workers.slicing.engine`; one batch's activations on
   the device at once), accumulates the pooled second moment of every signal a norm reads: the
   embedding output, the stream between attention and MLP, and every block output (the last one
   is what the final norm reads);
2. Q = its eigenvectors, by decreasing eigenvalue;
3. each norm's scale is folded into the linears reading it, together with sqrt(D / d); the norm
   stays the family's own RMSNorm module with weight 1 over d coordinates and epsilon eps * D / d:
   sqrt(D/d) * x_d / sqrt(|x_d|^2 / d + eps D / d) = x_d / sqrt(|x_d|^2 / D + eps), the weight-free
   norm over the original width the per-layer layout uses. (The factor goes into the readers, not
   into a norm weight of sqrt(D/d), because 1 is exact in bf16 and sqrt(4/3) is not);
4. readers W @ Q[:, :d], writers Q[:, :d]^T W, embeddings E @ Q[:, :d], head W_head diag(g) Q[:, :d]:
   the head is untied, since the final norm's scale g is folded into it and the embedding cannot
   share that;
5. the config becomes the stock config at d (head_dim stated, tie_word_embeddings false, every
   RMSNorm's epsilon scaled), and so do the modules' epsilons, Qwen3's per-head q/k norms included
   (config.rms_norm_eps is one field for all of them): their epsilon grows by D / d, a change of
   relative order eps / mean(q^2) in their output, far below float tolerance at eps = 1e-6.

At sparsity 0 (d = D) the model computes the dense logits (Q is only a rotation).
"""

from __future__ import annotations

import contextlib
import enum
import math
import time
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from core.families import stock_layout_refusal, unsupported_message
from core.methods import STOCK_LAYOUT
from core.param_count import predict_dense_param_count, predict_stock_param_count, sliced_width, stock_config
from workers.architectures import FamilyAdapter, UnsupportedArchitectureError, config_dict, detect_family
from workers.block_inputs import (
    BlockBatch,
    ProgressCallback,
    StopCheck,
    calibration_keep,
    capture_block_inputs,
    home_device,
    move_to,
)
from workers.slicing.engine import SlicingStopped, count_parameters, is_fused
from workers.slicing.fusion import hidden_width, untie_head
from workers.slicing.pca import principal_basis
from workers.slicing.portable.sliced_modules import BRANCHES, SkipConnectedBlock, norm_epsilon
from workers.slicing.portable.sliced_weights import tensor_of
from workers.slicing.report import SlicedWidths, SlicingReport, kept_directions
from workers.slicing.weights import fold_norm_into_readers, rotate_embedding, rotate_readers, rotate_writers

EPSILON_ATTRIBUTES = ("variance_epsilon", "eps")  # where HF RMSNorm modules keep their epsilon


class Pooling(enum.StrEnum):
    """How the residual signals are pooled into the one second moment whose eigenvectors are Q."""

    token = "token"  # sum over signals and positions of x x^T / |x|^2: what each norm's readers see
    signal = "signal"  # sum over signals of C_s / trace(C_s): every signal weighs the same
    raw = "raw"  # sum over signals of C_s: late signals, with the largest norms, dominate


DEFAULT_POOLING = Pooling.token  # best of the three on SmolLM2-135M at s = 0.25 (docs/science.md)


class PooledMoment:
    """The pooled second moment of several signals (float64, on the compute device)."""

    def __init__(self, width: int, device: torch.device, pooling: Pooling) -> None:
        self.matrix = torch.zeros(width, width, dtype=torch.float64, device=device)  # (D, D)
        self.pooling = pooling
        self.signals = 0

    def open_signal(self) -> torch.Tensor:
        """An empty moment for one signal, filled batch by batch (`accumulate`), then `close_signal`."""
        return torch.zeros_like(self.matrix)

    def accumulate(self, moment: torch.Tensor, hidden: torch.Tensor, keep: torch.Tensor) -> None:
        """One batch of a signal: hidden (B, T, D), keep (B, T) bool (False at padded positions)."""
        x = hidden.to(device=self.matrix.device, dtype=torch.float64)
        x = x[keep.to(device=x.device, dtype=torch.bool)]  # (positions, D)
        if self.pooling is Pooling.token:
            x = x / x.norm(dim=-1, keepdim=True).clamp_min(1e-30)
        moment += x.T @ x

    def close_signal(self, moment: torch.Tensor) -> None:
        if self.pooling is Pooling.signal:
            moment /= moment.diagonal().sum().clamp_min(1e-30)
        self.matrix += moment
        self.signals += 1

    def add(self, signal: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """One signal over all its batches: [(hidden (B, T, D), keep (B, T) bool)]."""
        moment = self.open_signal()
        for hidden, keep in signal:
            self.accumulate(moment, hidden, keep)
        self.close_signal(moment)


def check_stock_family(model: PreTrainedModel, adapter: FamilyAdapter) -> None:
    """Refuse what the stock layout cannot express: LayerNorms, parallel-residual blocks, norms on
    branch outputs (by structure, whatever the config calls the model)."""
    blocks = adapter.blocks(model)
    if (
        adapter.uses_layernorm
        or any(adapter.is_parallel(block) for block in blocks)
        or any(adapter.output_norm(block, branch) is not None for block in blocks for branch in BRANCHES)
    ):
        reason = stock_layout_refusal(config_dict(model)) or unsupported_message(
            config_dict(model), "its blocks are parallel-residual, use LayerNorm or normalise branch outputs"
        )
        raise UnsupportedArchitectureError(reason)


@torch.no_grad()
def slice_model_stock(
    model: PreTrainedModel,
    calibration_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    sparsity: float,
    *,
    round_to: int = 8,
    batch_size: int = 8,
    device: torch.device | str | None = None,
    pooling: Pooling | str = DEFAULT_POOLING,
    keep_bases: bool = True,
    progress: ProgressCallback | None = None,
    should_stop: StopCheck | None = None,
) -> SlicingReport:
    """Slice `model` in place into the stock layout at d = floor((1 - sparsity) * D) (rounded down
    to `round_to`), calibrated on `calibration_ids` (N, T); arguments as `slice_model`'s.

    Progress counts the blocks of the calibration pass (the rotation after it is cheap); stopping
    before a block raises SlicingStopped before any weight changed. UnsupportedArchitectureError for
    families that cannot be stock (LayerNorm, parallel residual) or cannot be sliced at all.
    """
    started = time.perf_counter()
    pooling = Pooling(pooling)
    keep = calibration_keep(calibration_ids, attention_mask, batch_size)
    adapter = detect_family(model)
    check_stock_family(model, adapter)
    if is_fused(model, adapter):
        raise ValueError("the model is already fused or sliced; slice the original dense model")
    model.eval()
    dense_config = model.config.to_dict()
    full = hidden_width(model, adapter)
    width = sliced_width(full, sparsity, round_to)
    home = home_device(model)
    compute = torch.device(device) if device is not None else home
    params_before = count_parameters(model)
    blocks = adapter.blocks(model)

    batches = capture_block_inputs(model, adapter, calibration_ids, keep, batch_size, compute, home)
    timings: dict[str, Any] = {"capture": time.perf_counter() - started, "blocks": []}
    moment = pooled_moment(
        adapter, blocks, batches, full, compute, home, pooling, timings, progress, should_stop
    )
    batches.clear()
    rotate_started = time.perf_counter()
    _, basis = principal_basis(moment.matrix)  # (D, D) float64, columns by decreasing eigenvalue
    apply_shared_basis(model, adapter, basis, width, compute)
    timings["rotate"] = time.perf_counter() - rotate_started
    timings["total"] = time.perf_counter() - started
    predicted: tuple[int | None, int | None] = (None, None)
    with contextlib.suppress(KeyError, TypeError, ValueError):  # a model_type without a formula
        predicted = (predict_dense_param_count(dense_config), predict_stock_param_count(dense_config, width))
    return SlicingReport(
        family=adapter.name,
        hidden_size=full,
        sparsity=sparsity,
        round_to=round_to,
        slice_head=True,
        widths=SlicedWidths.uniform(full, width, len(blocks), slice_head=True),
        params_before=params_before,
        params_after=count_parameters(model),
        predicted_params_before=predicted[0],
        predicted_params_after=predicted[1],
        calibration_sequences=int(calibration_ids.shape[0]),
        calibration_tokens=int(keep.sum()),
        device=str(compute),
        dtype=str(adapter.embeddings(model)[0].weight.dtype).removeprefix("torch."),
        timings=timings,
        layout=STOCK_LAYOUT,
        pooling=pooling.value,
        bases=[kept_directions(basis, width)] * (len(blocks) + 1) if keep_bases else None,  # one for all
    )


def pooled_moment(
    adapter: FamilyAdapter,
    blocks: nn.ModuleList,
    batches: list[BlockBatch],
    full: int,
    compute: torch.device,
    home: torch.device,
    pooling: Pooling,
    timings: dict[str, Any],
    progress: ProgressCallback | None,
    should_stop: StopCheck | None,
) -> PooledMoment:
    """The dense pass: every signal a norm reads, pooled (the model is not changed)."""
    moment = PooledMoment(full, compute, pooling)
    moment.add([(batch.hidden, batch.keep) for batch in batches])  # the embedding output
    if progress is not None:
        progress(0, len(blocks))
    for index, block in enumerate(blocks):
        if should_stop is not None and should_stop():
            raise SlicingStopped(f"stopped before block {index} of {len(blocks)}; the model is unchanged")
        block_started = time.perf_counter()
        block.to(compute)
        wrapper = SkipConnectedBlock(block, adapter)  # identity skips: the dense block, branch by branch
        mids, outs = moment.open_signal(), moment.open_signal()  # (D, D) each, filled batch by batch
        for batch in batches:
            hidden, (args, kwargs) = move_to((batch.hidden, batch.call(index)), compute)
            mid = wrapper.attention_residual(hidden, wrapper.call_arguments(hidden, args, kwargs))
            out = wrapper.mlp_residual(mid)  # (B, T, D)
            moment.accumulate(mids, mid, batch.keep)
            moment.accumulate(outs, out, batch.keep)
            batch.hidden = out.to(home)
        moment.close_signal(mids)
        moment.close_signal(outs)
        block.to(home)
        timings["blocks"].append(time.perf_counter() - block_started)
        if progress is not None:
            progress(index + 1, len(blocks))
    return moment


def _restock_norm(norm: nn.Module, full: int, width: int) -> None:
    """The family's RMSNorm over `width` coordinates, weight 1, epsilon eps * D / d."""
    weight = tensor_of(norm, "weight")
    norm.weight = nn.Parameter(
        torch.ones(width, dtype=weight.dtype, device=weight.device), requires_grad=False
    )
    _set_epsilon(norm, norm_epsilon(norm) * full / width)


def _set_epsilon(norm: nn.Module, eps: float) -> None:
    for attribute in EPSILON_ATTRIBUTES:
        if isinstance(getattr(norm, attribute, None), float | int):
            setattr(norm, attribute, eps)
            return
    raise ValueError(f"cannot find the epsilon of norm {type(norm).__name__}")


def _fold_and_restock(
    adapter: FamilyAdapter,
    norm: nn.Module,
    readers: list[nn.Module],
    full: int,
    width: int,
    compute: torch.device,
) -> None:
    """Readers W <- W diag(g) sqrt(D / d); the norm keeps weight 1 at width d (module docstring, 3)."""
    scale, _ = adapter.norm_scale_shift(norm)
    if scale is None:
        raise UnsupportedArchitectureError(f"{type(norm).__name__} has no scale to fold")
    fold_norm_into_readers(readers, scale.detach().double() * math.sqrt(full / width), None, compute)
    _restock_norm(norm, full, width)


@torch.no_grad()
def apply_shared_basis(
    model: PreTrainedModel, adapter: FamilyAdapter, basis: torch.Tensor, width: int, compute: torch.device
) -> None:
    """Steps 3-5 of the module docstring with a given basis (D, D) float64 on `compute`, whose first
    `width` columns are kept: fold, rotate and slice one block on `compute` at a time, then make the
    config the stock config at d."""
    dense_config = model.config.to_dict()
    full = hidden_width(model, adapter)
    home = home_device(model)
    basis = basis.to(device=compute, dtype=torch.float64)
    untie_head(model, adapter)
    for embedding in adapter.embeddings(model):
        rotate_embedding(embedding, basis, width)
    for block in adapter.blocks(model):
        block.to(compute)
        _fold_and_restock(
            adapter, adapter.attn_norm(block), adapter.attn_readers(block), full, width, compute
        )
        _fold_and_restock(adapter, adapter.mlp_norm(block), adapter.mlp_readers(block), full, width, compute)
        rotate_readers(adapter.attn_readers(block) + adapter.mlp_readers(block), basis, width)
        rotate_writers(adapter.attn_writers(block) + adapter.mlp_writers(block), basis, width)
        block.to(home)
    head = adapter.lm_head(model)
    _fold_and_restock(adapter, adapter.final_norm(model), [head], full, width, compute)
    rotate_readers([head], basis, width)
    _restock_config(model, dense_config, width)


def _restock_config(model: PreTrainedModel, dense_config: dict[str, Any], width: int) -> None:
    """The config becomes the stock config at d; every RMSNorm's epsilon follows config.rms_norm_eps."""
    sliced = stock_config(dense_config, width)
    for key in ("hidden_size", "head_dim", "tie_word_embeddings", "rms_norm_eps"):
        setattr(model.config, key, sliced[key])
    old_eps, new_eps = float(dense_config["rms_norm_eps"]), float(sliced["rms_norm_eps"])
    for module in model.modules():  # Qwen3's per-head q/k norms read config.rms_norm_eps too
        for attribute in EPSILON_ATTRIBUTES:
            value = getattr(module, attribute, None)
            if isinstance(value, float) and math.isclose(value, old_eps, rel_tol=1e-12):
                setattr(module, attribute, new_eps)
