"""The profile: what slicing would discard, measured in one dense pass (docs/science.md, "Predicting
before pruning").

`profile_model` runs the calibration windows through the dense model block by block, as slicing
does (one block on the compute device at a time, the activations where the model lives, progress
"block i/L"), and does not change the model. For every residual signal slicing computes a PCA of
(the embedding output, each block's pre-MLP stream, each block's output; the last one is what the
final norm reads) it keeps:

- the eigenvalues of the uncentred second moment C / positions, descending (not damped; the
  damping slicing adds to the diagonal shifts every eigenvalue alike and leaves the basis as is);
  the eigenvectors are slicing's basis;
- the energy: the share of each eigenvector in the signal's energy on the windows the profile is
  *measured on*: the calibration windows themselves by default (then it is the eigenvalue share), or
  other windows (`measured_ids`), text like what the model will be scored on. In-sample, a basis
  fitted to the calibration text always looks good; on other text it shows what slicing will lose
  there (docs/science.md measured how much that matters);
- the token energy: the same share for the *normalised* tokens x / |x| (on the measured windows),
  the stream the norms hand to the linears. A massive-activation direction holds most of
  the raw energy of late signals, so the raw spectrum says little about what a norm's readers lose;
  the token energy says it token by token;
- a logit-lens reading per kept width d: that one signal projected on its top-d eigenvectors,
  h' = h Q_d Q_d^T, read through the final norm and the head like the probes' counterfactual
  (`workers.probing.counterfactual`), compared with h read the same way: mean KL(p || q) and its
  Taylor estimate (`workers.probing.deviation`, the probes' own functions), and the mean increase
  of the next token's NLL, on `lens_tokens` positions spread evenly over the measured windows (first
  position of each window, the attention sink, left out; 0: no lens readings). The head runs in
  float32 whatever the model dtype.

LayerNorm families (OPT, GPT-2, ...) are sliced after their mean is removed, so their signals are
profiled centred (x - mean(x)), as slicing's PCAs see them. A family slicing refuses (Gemma-1's
(1 + weight) norms, for one) runs each block whole and profiles only the block outputs; its slicing refusal
is reported, and what the profile offers it is the mask errors below.

Per block linear, the same pass also measures what each unstructured mask rule would remove at
each sparsity (`workers.profiling.mask_errors`): the intra-layer pruners' predictor features.

Cost: the dense pass, its float64 moments (slicing's; the token energy's from float32 products),
one D x D eigendecomposition per signal, and per signal (1 + widths) head readings of `lens_tokens`
positions, then about five passes over the vocabulary per reading (`kl_with_nll_increase`; on
SmolLM2 they take about as long as the head's nested GEMMs). A narrow model read at several widths
gets the widths' logits as prefix sums over the basis, about one head product per token plus one
V x D x (D - d_min) per signal (`workers.profiling.nested_lens`); otherwise one GEMM per chunk of
lens tokens reads the rows and every width together (bench/README.md has the costs on SmolLM2).
The mask errors add their own cost (`workers.profiling.mask_errors`; on SmolLM2, 3 rules at 5
sparsities, about 0.15 of a dense pass, plus their input moments during the pass). Peak memory:
slicing's (the model, the calibration activations of one signal, one block's temporaries) plus the
measured windows' activations, the lens rows of one signal, the logits of one chunk of lens tokens
at every width, the prefix sums' G columns when they are used (at most MAX_FACTOR_BYTES) and one
block's mask moments.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from core.param_count import sliced_width
from core.profiles import MASK_RULES
from workers.architectures import (
    FamilyAdapter,
    UnsupportedArchitectureError,
    detect_family,
    match_structure,
)
from workers.block_inputs import (
    BlockBatch,
    ProgressCallback,
    StopCheck,
    calibration_keep,
    capture_block_inputs,
    home_device,
    move_to,
)
from workers.probing.common import token_chunks
from workers.probing.deviation import DistributionReference, kl_with_nll_increase
from workers.probing.head import Float32Head
from workers.profiling.mask_errors import LinearError, linear_errors, mask_moments
from workers.profiling.moments import _LensRows, _Signal
from workers.profiling.nested_lens import AffineNorm, NestedWidthLogits
from workers.profiling.report import (
    DEFAULT_LENS_TOKENS,
    LensReading,
    ProfileReport,
    ProfileStopped,
    SignalProfile,
)
from workers.pruning.linears import block_linears
from workers.pruning.recording import InputRecorder
from workers.pruning.stream import run_block
from workers.slicing.fusion import hidden_width
from workers.slicing.portable.sliced_modules import ParallelSkipConnectedBlock, SkipConnectedBlock


@torch.no_grad()
def profile_model(
    model: PreTrainedModel,
    calibration_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    sparsities: list[float],
    *,
    round_to: int = 8,
    batch_size: int = 8,
    lens_tokens: int = DEFAULT_LENS_TOKENS,
    measured_ids: torch.Tensor | None = None,
    measured_mask: torch.Tensor | None = None,
    mask_rules: tuple[str, ...] = MASK_RULES,
    device: torch.device | str | None = None,
    progress: ProgressCallback | None = None,
    should_stop: StopCheck | None = None,
) -> ProfileReport:
    """Profile `model` on `calibration_ids` (N, T) for slicing to each of `sparsities` (module
    docstring); the widths are slicing's, d = floor((1 - s) D) rounded down to `round_to`.

    The bases are always the calibration windows' (slicing's). With `measured_ids` (M, T') what they
    discard, and the lens readings, are measured on those windows instead: text like what the pruned
    model will be scored on, so the profile sees how well the calibration generalises to it.
    `mask_rules` (empty: none) are measured on every block linear. Unsupported models raise
    UnsupportedArchitectureError; the model is left unchanged."""
    started = time.perf_counter()
    keep = calibration_keep(calibration_ids, attention_mask, batch_size)
    adapter, refusal = _adapter(model)
    model.eval()
    full = hidden_width(model, adapter)
    widths = [sliced_width(full, s, round_to) for s in sparsities]
    home = home_device(model)
    compute = torch.device(device) if device is not None else home
    blocks = adapter.blocks(model)
    centred = adapter.uses_layernorm
    stream = _Stream(model, adapter, calibration_ids, keep, batch_size, compute, home)
    measured = stream
    if measured_ids is not None:
        measured_keep = calibration_keep(measured_ids, measured_mask, batch_size)
        measured = _Stream(model, adapter, measured_ids, measured_keep, batch_size, compute, home)
    lens = _LensRows.choose(measured.ids, measured.keep, batch_size, lens_tokens)
    reader = _HeadReader(model, adapter, compute, lens.labels)
    timings: dict[str, Any] = {
        "capture": time.perf_counter() - started,
        "blocks": [],
        "lens": 0.0,
        "masks": 0.0,
    }

    def finish(pairs: list[tuple[str, _Signal, _Signal]], layer: int | None) -> None:
        for kind, basis, seen in pairs:
            signals.append(_finish(basis, seen, len(signals), kind, layer, widths, reader, timings))

    signals: list[SignalProfile] = []
    errors: list[LinearError] = []
    separate = measured is not stream
    own_lens = None if separate else lens  # the calibration stream reads the lens only if measured on
    seen = measured.embedding(full, compute, centred, lens) if separate else None
    finish(_zip(stream.embedding(full, compute, centred, own_lens), seen), None)
    basis_moments = mask_moments(int(keep.sum()), squares_only=separate)  # the errors are measured on `seen`
    seen_moments = mask_moments(int(measured.keep.sum()))
    if progress is not None:
        progress(0, len(blocks))
    for index, block in enumerate(blocks):
        if should_stop is not None and should_stop():
            raise ProfileStopped(f"stopped before block {index} of {len(blocks)}")
        block_started = time.perf_counter()
        block.to(compute)
        run = _BlockRun(adapter, index, block, full, compute, home, centred, whole=refusal is not None)
        linears = block_linears(adapter, block) if mask_rules else []
        with InputRecorder(linears, basis_moments, compute) as basis_inputs:
            basis_signals = run.signals(stream.batches, own_lens, basis_inputs)
        seen_inputs, seen_signals = basis_inputs, None
        if separate:
            with InputRecorder(linears, seen_moments, compute) as seen_inputs:
                seen_signals = run.signals(measured.batches, lens, seen_inputs)
        finish(_zip(basis_signals, seen_signals), index)
        if linears:
            masks_started = time.perf_counter()
            errors += linear_errors(
                index,
                linears,
                basis_inputs.statistics(index),
                seen_inputs.statistics(index),
                sparsities,
                mask_rules,
            )
            timings["masks"] += time.perf_counter() - masks_started
        block.to(home)
        timings["blocks"].append(time.perf_counter() - block_started)
        if progress is not None:
            progress(index + 1, len(blocks))
    stream.batches.clear()
    measured.batches.clear()
    timings["lens_nested_signals"] = reader.nested_signals
    timings["total"] = time.perf_counter() - started
    return ProfileReport(
        family=adapter.name,
        hidden_size=full,
        num_layers=len(blocks),
        sparsities=list(sparsities),
        round_to=round_to,
        widths=widths,
        calibration_sequences=int(calibration_ids.shape[0]),
        calibration_tokens=int(keep.sum()),
        lens_tokens=int(lens.labels.numel()),
        device=str(compute),
        dtype=str(adapter.embeddings(model)[0].weight.dtype).removeprefix("torch."),
        signals=signals,
        timings=timings,
        measured_tokens=int(measured.keep.sum()),
        linears=errors,
        mask_rules=list(mask_rules),
        slicing_refusal=refusal,
    )


def _adapter(model: PreTrainedModel) -> tuple[FamilyAdapter, str | None]:
    """Slicing's adapter, or (for a model slicing refuses) the structural one and the refusal;
    UnsupportedArchitectureError when no adapter knows the structure."""
    try:
        return detect_family(model), None
    except UnsupportedArchitectureError as refusal:
        return match_structure(model), str(refusal)


class _Stream:
    """Windows on their way through the dense blocks: what block 0 receives, batch by batch."""

    def __init__(
        self,
        model: PreTrainedModel,
        adapter: FamilyAdapter,
        ids: torch.Tensor,
        keep: torch.Tensor,
        batch_size: int,
        compute: torch.device,
        home: torch.device,
    ) -> None:
        self.ids, self.keep = ids, keep
        self.batches = capture_block_inputs(model, adapter, ids, keep, batch_size, compute, home)

    def embedding(
        self, full: int, compute: torch.device, centred: bool, lens: _LensRows | None
    ) -> list[tuple[str, _Signal]]:
        """The embedding output as a signal (lens rows gathered when `lens` is given)."""
        signal = _Signal(full, compute, centred, measured=lens is not None)
        for b, batch in enumerate(self.batches):
            signal.add(batch.hidden, batch.keep, None if lens is None else lens.gather(b, batch.hidden))
        return [("embedding", signal)]


def _zip(
    basis: list[tuple[str, _Signal]], seen: list[tuple[str, _Signal]] | None
) -> list[tuple[str, _Signal, _Signal]]:
    """(kind, the signal the basis comes from, the signal it is measured on): one and the same
    without separate measured windows."""
    if seen is None:
        return [(kind, signal, signal) for kind, signal in basis]
    return [(kind, b, m) for (kind, b), (_, m) in zip(basis, seen, strict=True)]


@dataclass(frozen=True)
class _BlockRun:
    """One dense block run on batches, branch by branch (or whole, for a family slicing refuses)."""

    adapter: FamilyAdapter
    index: int
    block: nn.Module
    full: int
    compute: torch.device
    home: torch.device
    centred: bool
    whole: bool  # run the block as the model does and profile only its output

    def signals(
        self, batches: list[BlockBatch], lens: _LensRows | None, recorder: InputRecorder
    ) -> list[tuple[str, _Signal]]:
        """The block on every batch; each batch advances to the block output. Lens rows are
        gathered, and the token energy accumulated, only when `lens` is given (the windows the
        profile is measured on)."""
        parallel = self.whole or self.adapter.is_parallel(self.block)
        measured = lens is not None
        mid = None if parallel else _Signal(self.full, self.compute, self.centred, measured)
        out = _Signal(self.full, self.compute, self.centred, measured)
        for b, batch in enumerate(batches):
            recorder.start(batch.keep)
            y = self._output(batch, b, lens, mid)  # (B, T, D)
            out.add(y, batch.keep, None if lens is None else lens.gather(b, y))
            batch.hidden = y.to(self.home)
        return [("output", out)] if mid is None else [("pre-mlp", mid), ("output", out)]

    def _output(self, batch: BlockBatch, b: int, lens: _LensRows | None, mid: _Signal | None) -> torch.Tensor:
        if self.whole:
            return run_block(self.block, self.index, batch, self.compute)
        hidden, (args, kwargs) = move_to((batch.hidden, batch.call(self.index)), self.compute)
        if mid is None:
            return ParallelSkipConnectedBlock(self.block, self.adapter)(hidden, *args, **kwargs)
        wrapper = SkipConnectedBlock(self.block, self.adapter)  # identity skips: the dense block
        h = wrapper.attention_residual(hidden, wrapper.call_arguments(hidden, args, kwargs))
        mid.add(h, batch.keep, None if lens is None else lens.gather(b, h))
        return wrapper.mlp_residual(h)


def _finish(
    basis: _Signal,
    seen: _Signal,
    index: int,
    kind: str,
    layer: int | None,
    widths: list[int],
    reader: _HeadReader,
    timings: dict[str, Any],
) -> SignalProfile:
    """The eigendecomposition of `basis`'s moment (slicing's), and in that basis the energy shares,
    token energies and lens readings of `seen` (the same signal, or its measured windows)."""
    values, vectors = torch.linalg.eigh(basis.raw / max(basis.positions, 1))  # ascending
    order = torch.argsort(values, descending=True)
    values, vectors = values[order].clamp_min(0.0), vectors[:, order]  # (D,), (D, D)
    lens_started = time.perf_counter()
    rows = torch.cat(seen.lens_rows) if seen.lens_rows else None  # (n, D)
    readings = [] if rows is None or rows.shape[0] == 0 else reader.read(rows, vectors, widths)
    timings["lens"] += time.perf_counter() - lens_started
    return SignalProfile(
        index=index,
        kind=kind,
        layer=layer,
        eigenvalues=values.tolist(),
        energy=_shares(vectors, seen.raw).tolist(),
        token_energy=_shares(vectors, seen.normalised).tolist(),
        lens=readings,
    )


def _shares(vectors: torch.Tensor, moment: torch.Tensor) -> torch.Tensor:
    """diag(Q^T M Q) / trace: each eigenvector's share of a moment's energy, summing to 1."""
    shares = (vectors.T @ moment @ vectors).diagonal().clamp_min(0.0)  # (D,)
    return shares / shares.sum().clamp_min(1e-30)


_ChunkLogits = Callable[[slice], list[torch.Tensor]]
"""A chunk of lens tokens -> logits of the rows, then of each kept width (widest first)."""


class _HeadReader:
    """The final norm and the head in float32 on the compute device, reading lens rows."""

    def __init__(
        self, model: PreTrainedModel, adapter: FamilyAdapter, compute: torch.device, labels: torch.Tensor
    ) -> None:
        self.head = Float32Head(adapter, model, compute)
        self.labels = labels.to(compute)
        self.compute = compute
        self.nested_signals = 0  # signals read by prefix sums (`workers.profiling.nested_lens`)

    @cached_property
    def affine_norm(self) -> AffineNorm | None:
        """The final norm's parameters, when it shows the affine form prefix sums need."""
        return AffineNorm.read_off(self.head.norm, int(self.head.weight.shape[1]), self.compute)

    def read(self, rows: torch.Tensor, vectors: torch.Tensor, widths: list[int]) -> list[LensReading]:
        """Per width: rows projected on the top-d eigenvectors, read against the rows."""
        rows = rows.to(self.compute)
        kept = sorted(set(widths), reverse=True)
        logits_of = self._nested(rows, vectors, kept) or self._plain(rows, vectors, kept)
        sums = torch.zeros(len(kept), 3, dtype=torch.float64)
        for chunk in token_chunks(rows.shape[0], self.head.vocab):
            dense, *projected = logits_of(chunk)
            reference = DistributionReference.of(dense)
            labels = self.labels[chunk]
            for i, logits in enumerate(projected):
                kl, increase = kl_with_nll_increase(reference, logits, labels)
                assert kl.estimates is not None  # KL always carries its Taylor estimate
                sums[i] += torch.stack([kl.values.sum(), kl.estimates.sum(), increase.sum()]).double().cpu()
        n = max(rows.shape[0], 1)
        means = {d: (sums[i] / n).tolist() for i, d in enumerate(kept)}
        return [
            LensReading(width=d, kl=means[d][0], kl_taylor=means[d][1], nll_increase=means[d][2])
            for d in widths
        ]

    def _plain(self, rows: torch.Tensor, vectors: torch.Tensor, kept: list[int]) -> _ChunkLogits:
        """Rows projected in float64; a chunk of tokens goes through the head once for the rows and
        every width together: one GEMM of (1 + widths) x chunk rows runs about twice as fast per
        row on a CPU as one per width."""
        rows64 = rows.double()
        projected = [(rows64 @ vectors[:, :d] @ vectors[:, :d].T).to(rows.dtype) for d in kept]
        readings = torch.stack([rows, *projected])  # (1 + k, n, D)

        def logits_of(chunk: slice) -> list[torch.Tensor]:
            stacked = readings[:, chunk]  # (1 + k, c, D)
            logits = self.head(stacked.reshape(-1, stacked.shape[-1]))
            return list(logits.view(*stacked.shape[:2], -1).unbind(0))

        return logits_of

    def _nested(self, rows: torch.Tensor, vectors: torch.Tensor, kept: list[int]) -> _ChunkLogits | None:
        """Prefix sums over the basis when they pay and the norm has the affine form."""
        full = int(vectors.shape[0])
        if not NestedWidthLogits.pays(rows.shape[0], self.head.vocab, full, kept):
            return None
        norm = self.affine_norm
        if norm is None or not norm.matches(self.head.norm, rows.float()):
            return None
        nested = NestedWidthLogits(self.head, norm, vectors, kept)
        self.nested_signals += 1

        def logits_of(chunk: slice) -> list[torch.Tensor]:
            by_width = dict(zip(nested.edges, nested.logits(rows[chunk]), strict=True))
            return [by_width[full], *(by_width[d] for d in kept)]

        return logits_of
