"""Local counterfactual per layer (docs/science.md §3): what pruning one sublayer does at that layer.

For each prompt the dense model runs once, and every block's input, call arguments and output
are captured. Then, for each dense layer l and each sublayer kind, one block forward on the DENSE
input of layer l gives the counterfactual output y'_l:

- "attention": dense block l with only its attention linears (readers and writers) swapped for
  the pruned model's corresponding linears, measured where the research measures it: at the
  attention sublayer's output, the mid-stream h = x + attn(norm(x)) against the dense block's, so
  that the MLP's reaction is not counted as the attention's (MEASURING_POINTS). Parallel-residual
  blocks (attention and MLP both read x) have no mid-stream: there it is the block output;
- "mlp": the same with the MLP linears, at the block output: the dense mid-stream plus the pruned
  MLP, which is the MLP sublayer's output;
- "block": the whole pruned block (layer_map[l]); the identity (y' = x) when the pruned model
  removed the block, in which case only "block" is recorded.

Modules are swapped by path and the block's own forward is called, so every family's forward
(post-norm Gemma-3 included) stays the one HF wrote. "attention" / "mlp" are skipped (nothing
recorded) where the pruned linears equal the dense ones (an MLP of an attention-drop model);
"block" is always recorded, and where the whole pruned block equals the dense one y' = y without
a forward, so untouched layers show an exact 0. Cost: one dense pass plus one block forward per
layer and computed sublayer.

A sliced (SliceGPT) model's stream lives in another basis and width. Given the kept directions of
every block-boundary signal (`SlicingReport.bases`: B_k, D x d_k), its block l is compared whole:
y'_l = pruned_block_l(x_l B_l) B_{l+1}^T, the dense input mapped into the sliced basis and the output
mapped back (exact at sparsity 0, where every B is a rotation). Its attention and MLP read and write
widths the dense block does not have, so they are not swapped in alone.

Shifts y vs y' are measured in the embedding space, in logits lm_head(final_norm(.)) (the dense
model's final norm and head read both: the logit lens of layer l) and in probabilities. The first
position of each prompt is left out of every mean: it carries the attention sink's massive
activation, whose scale swamps the other tokens.

Under the `released-code` convention (`core.probe_conventions`) the logit lens is the dense
lm_head alone, in the model's dtype, and the probability space takes the pruned distribution as
its reference: KL(q || p), with the estimates Var_q(dz) / (2 T^2) and r proportional to q^2.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from core.probe_conventions import PRUNECAST, ProbeConvention, Reference
from workers.architectures import FamilyAdapter
from workers.probing.block_calls import _BlockCall, _capture_blocks, same_module, swapped
from workers.probing.common import (
    family_adapters,
    model_device,
    residual_mismatch,
    token_chunks,
)
from workers.probing.deviation import (
    DistributionReference,
    TokenDeviation,
    VectorReference,
    probability_deviations,
    vector_deviations,
)
from workers.probing.head import LogitReader, lens_head
from workers.probing.records import ProbeRecord, ProbeStopped, ProgressCallback, RecordSums, StopCheck
from workers.slicing.portable.sliced_modules import get_path

SUBLAYERS = ("attention", "mlp", "block")
MEASURING_POINTS = {
    "attention": "attention sublayer output: x + attn(norm(x)) (block output in parallel-residual blocks)",
    "mlp": "MLP sublayer output: the dense mid-stream + the pruned MLP (the block output)",
    "block": "block output",
}
"""Where each sublayer's counterfactual is measured (recorded in the probe job's protocol)."""
SLICED_SUBLAYERS_REASON = (
    "a sliced model's attention and MLP read and write its own widths and bases, so they cannot be "
    "swapped into a dense block alone; its blocks are compared whole, through the kept bases"
)


def branch_paths(adapter: FamilyAdapter, sublayer: str) -> tuple[str, ...]:
    """Paths (inside a block) of the linears a sublayer swaps."""
    if sublayer == "attention":
        return adapter.attn_reader_paths + adapter.attn_writer_paths
    if sublayer == "mlp":
        return adapter.mlp_reader_paths + adapter.mlp_writer_paths
    raise ValueError(f"unknown sublayer {sublayer!r}; known: {', '.join(SUBLAYERS)}")


def _plan(
    adapter: FamilyAdapter,
    dense_blocks: nn.ModuleList,
    pruned_blocks: nn.ModuleList,
    layer_map: list[int | None],
    sublayers: Sequence[str],
) -> list[dict[str, str]]:
    """Per dense layer, sublayer -> how to compute it: "swap", "pruned", "identity" or "same"."""
    plan: list[dict[str, str]] = []
    for layer, target in enumerate(layer_map):
        steps: dict[str, str] = {}
        if target is None:
            if "block" in sublayers:
                steps["block"] = "identity"
            plan.append(steps)
            continue
        dense_block, pruned_block = dense_blocks[layer], pruned_blocks[target]
        for sublayer in sublayers:
            if sublayer == "block":
                steps[sublayer] = "same" if same_module(dense_block, pruned_block) else "pruned"
                continue
            paths = branch_paths(adapter, sublayer)
            for path in paths:
                if not isinstance(get_path(pruned_block, path), nn.Module):
                    raise ValueError(f"pruned block {target} has no module {path!r} to swap in")
            if not all(same_module(get_path(dense_block, p), get_path(pruned_block, p)) for p in paths):
                steps[sublayer] = "swap"
        plan.append(steps)
    return plan


def check_layer_map(layer_map: Sequence[int | None], dense_blocks: int, pruned_blocks: int) -> None:
    if len(layer_map) != dense_blocks:
        raise ValueError(f"layer_map has {len(layer_map)} entries, the dense model {dense_blocks} blocks")
    for layer, target in enumerate(layer_map):
        if target is not None and not 0 <= target < pruned_blocks:
            raise ValueError(
                f"layer_map[{layer}] = {target}, but the pruned model has {pruned_blocks} blocks"
            )


def counterfactual_unavailable(
    dense: nn.Module, pruned: nn.Module, bases: Sequence[torch.Tensor] | None = None
) -> str | None:
    """Why the per-layer counterfactual cannot compare these two models (a SliceGPT model's stream
    has another width and basis, and its bases were not kept), or None when it can."""
    adapter, _ = family_adapters(dense, pruned)
    reason = residual_mismatch(adapter, dense, pruned)
    if reason is None or _bases_fit(adapter, pruned, bases):
        return None
    return (
        f"per-layer counterfactual needs equal hidden widths in one basis, or the sliced model's bases: "
        f"{reason}, and its artifact kept no bases"
    )


def _bases_on(bases: Sequence[torch.Tensor] | None, device: torch.device) -> list[torch.Tensor] | None:
    """The bases float64 on `device`, once each (the stock layout repeats one tensor for every signal)."""
    if bases is None:
        return None
    moved: dict[int, torch.Tensor] = {}
    for basis in bases:
        if id(basis) not in moved:
            moved[id(basis)] = basis.to(device=device, dtype=torch.float64)
    return [moved[id(basis)] for basis in bases]


def _bases_fit(adapter: FamilyAdapter, pruned: nn.Module, bases: Sequence[torch.Tensor] | None) -> bool:
    return bases is not None and len(bases) == len(adapter.blocks(pruned)) + 1


@torch.no_grad()
def counterfactual_probe(
    dense: nn.Module,
    pruned: nn.Module,
    layer_map: list[int | None],
    input_ids: list[torch.Tensor],
    *,
    temperature: float = 1.0,
    sublayers: Sequence[str] = SUBLAYERS,
    bases: Sequence[torch.Tensor] | None = None,
    step_positions: Sequence[list[int]] | None = None,
    convention: ProbeConvention = PRUNECAST,
    progress: ProgressCallback | None = None,
    should_stop: StopCheck | None = None,
) -> list[ProbeRecord]:
    """Per dense layer and sublayer, the shift of the layer's output when only that sublayer is
    pruned, on the dense input. Records at probe "counterfactual": embedding and logits spaces
    ("1-cos" with estimate, "dpar", "dperp", "alpha") and probs space ("1-cos", "kl", with
    estimates), read as `convention` says (module docstring).

    `step_positions[i]` (one list per prompt) measures prompt i only at those positions, the j-th as
    decoding step j (`decoding.decoding_counterfactual_probe`); without it, every position but the first,
    with no step.

    `bases` (a sliced model's `SlicingReport.bases`) compares a SliceGPT model block by block
    (module docstring); without them, ValueError when the two streams differ in width or basis.
    """
    _check_arguments(sublayers, step_positions, input_ids)
    adapter, _ = family_adapters(dense, pruned)
    reason = counterfactual_unavailable(dense, pruned, bases)
    if reason is not None:
        raise ValueError(reason)
    # with bases the model is sliced even where the widths match (the stock layout at sparsity 0)
    sliced = bases is not None or residual_mismatch(adapter, dense, pruned) is not None
    dense_blocks, pruned_blocks = adapter.blocks(dense), adapter.blocks(pruned)
    check_layer_map(layer_map, len(dense_blocks), len(pruned_blocks))
    device = model_device(dense)
    if sliced:
        plan = [{"block": "mapped"} if "block" in sublayers else {} for _ in layer_map]
        bases = _bases_on(bases, device)
    else:
        plan = _plan(adapter, dense_blocks, pruned_blocks, layer_map, sublayers)
    sums = RecordSums("counterfactual")
    reading = _Reading(lens_head(adapter, dense, convention), temperature, convention.sublayer_reference)
    total, done = len(input_ids) * len(dense_blocks), 0
    for index, ids in enumerate(input_ids):
        positions = None if step_positions is None else step_positions[index]
        calls = _capture_blocks(adapter, dense, ids.to(device))
        for layer, steps in enumerate(plan):
            if should_stop is not None and should_stop():
                raise ProbeStopped(f"stopped before layer {layer}")
            call, target = calls[layer], layer_map[layer]
            pruned_block = None if target is None else pruned_blocks[target]
            at_mid = "attention" in steps and not adapter.is_parallel(dense_blocks[layer])
            outputs = {
                sublayer: (
                    call.run_mapped(pruned_blocks[layer], bases[layer], bases[layer + 1])
                    if how == "mapped" and bases is not None
                    else _sublayer_output(
                        adapter, call, how, sublayer, dense_blocks[layer], pruned_block, at_mid
                    )
                )
                for sublayer, how in steps.items()
            }
            if at_mid:  # the attention against the dense mid-stream, the rest against the output
                assert call.mid is not None  # captured for every sequential block
                attention = {"attention": outputs.pop("attention")}
                _measure(sums, reading, layer, call.mid, attention, positions)
            _measure(sums, reading, layer, call.output, outputs, positions)
            done += 1
            if progress is not None:
                progress(done, total)
    return sums.records()


def _check_arguments(
    sublayers: Sequence[str], step_positions: Sequence[list[int]] | None, input_ids: list[torch.Tensor]
) -> None:
    for sublayer in sublayers:
        if sublayer not in SUBLAYERS:
            raise ValueError(f"unknown sublayer {sublayer!r}; known: {', '.join(SUBLAYERS)}")
    if step_positions is not None and len(step_positions) != len(input_ids):
        raise ValueError(f"{len(step_positions)} lists of step positions for {len(input_ids)} prompts")


def _sublayer_output(
    adapter: FamilyAdapter,
    call: _BlockCall,
    how: str,
    sublayer: str,
    dense_block: nn.Module,
    pruned_block: nn.Module | None,
    at_mid: bool = False,
) -> torch.Tensor:
    """The layer's output with only `sublayer` pruned, as the plan says to get it: the input
    ("identity": the block was removed), the dense output ("same": untouched), the pruned block's
    output ("pruned"), or a hybrid block with that branch swapped in ("swap"); with `at_mid`, the
    hybrid's attention sublayer output instead of its block output."""
    if how == "identity":
        return call.hidden
    if how == "same":
        return call.output
    assert pruned_block is not None
    if how == "pruned":
        return call.run(pruned_block)
    with swapped(dense_block, pruned_block, branch_paths(adapter, sublayer)) as hybrid:
        if at_mid and sublayer == "attention":
            return call.mid_stream(hybrid, adapter)
        return call.run(hybrid)


@dataclass(frozen=True)
class _Reading:
    """How a layer's outputs are read: the logit lens, T, and which distribution is the reference."""

    head: LogitReader
    temperature: float
    reference: Reference

    def probabilities(
        self, z: torch.Tensor, z2: torch.Tensor, dense: DistributionReference | None
    ) -> list[TokenDeviation]:
        """ "1-cos" and "kl" of dense logits z against pruned z2, from the convention's reference."""
        if self.reference == "pruned":  # KL(q || p), estimates weighted by q
            return probability_deviations(z2, z, self.temperature)
        return probability_deviations(z, z2, self.temperature, dense)


def _measure(
    sums: RecordSums,
    reading: _Reading,
    layer: int,
    output: torch.Tensor,
    counterfactuals: dict[str, torch.Tensor],
    positions: list[int] | None = None,
) -> None:
    """Add the shifts output -> each counterfactual at one layer: over every position but the first,
    or, with `positions`, at each of those positions as decoding step 0, 1, ..."""
    if not counterfactuals:
        return
    rows_at = slice(1, None) if positions is None else positions  # the attention sink's position left out
    y = output[0, rows_at]  # (n, D)
    shifted = {sublayer: value[0, rows_at] for sublayer, value in counterfactuals.items()}
    hidden = VectorReference.of(y)
    steps = None if positions is None else list(range(len(positions)))
    for sublayer, y2 in shifted.items():
        _add(sums, "embedding", vector_deviations(y, y2, hidden), layer, sublayer, steps)
    head = reading.head
    for rows in token_chunks(y.shape[0], head.vocab):
        z = head(y[rows])  # (n, V) float32: the dense logits of this layer, shared by every sublayer
        logits = VectorReference.of(z)
        distribution = None
        if reading.reference == "dense":
            distribution = DistributionReference.of(z, reading.temperature)
        chunk_steps = None if steps is None else steps[rows]
        for sublayer, y2 in shifted.items():
            z2 = z if counterfactuals[sublayer] is output else head(y2[rows])  # same: y' = y
            _add(sums, "logits", vector_deviations(z, z2, logits), layer, sublayer, chunk_steps)
            _add(sums, "probs", reading.probabilities(z, z2, distribution), layer, sublayer, chunk_steps)


def _add(
    sums: RecordSums,
    space: str,
    deviations: list[TokenDeviation],
    layer: int,
    sublayer: str,
    steps: list[int] | None,
) -> None:
    """Every row into one point, or row i into the point of decoding step steps[i]."""
    if steps is None:
        sums.add_deviations(space, deviations, layer=layer, sublayer=sublayer)
        return
    for row, step in enumerate(steps):
        for deviation in deviations:
            estimates = None if deviation.estimates is None else deviation.estimates[row : row + 1]
            sums.add(
                space,
                deviation.metric,
                deviation.values[row : row + 1],
                estimates,
                layer=layer,
                sublayer=sublayer,
                step=step,
            )
