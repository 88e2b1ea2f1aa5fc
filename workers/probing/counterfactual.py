"""Local counterfactual per layer (docs/science.md §3): what pruning one sublayer does at that layer.

For each prompt the dense model runs once, and every block's input, call arguments and output
are captured. Then, for each dense layer l and each sublayer kind, one block forward on the DENSE
input of layer l gives the counterfactual output y'_l:

- "attention": dense block l with only its attention linears (readers and writers) swapped for
  the pruned model's corresponding linears;
- "mlp": the same with the MLP linears;
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
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from workers.probing.common import (
    block_hidden,
    family_adapters,
    model_device,
    residual_mismatch,
    token_chunks,
)
from workers.probing.deviation import (
    DistributionReference,
    VectorReference,
    probability_deviations,
    vector_deviations,
)
from workers.probing.records import ProbeRecord, ProbeStopped, ProgressCallback, RecordSums, StopCheck
from workers.slicing.adapters import FamilyAdapter
from workers.slicing.portable.sliced_modules import get_path, set_path

SUBLAYERS = ("attention", "mlp", "block")
SLICED_SUBLAYERS_REASON = (
    "a sliced model's attention and MLP read and write its own widths and bases, so they cannot be "
    "swapped into a dense block alone; its blocks are compared whole, through the kept bases"
)


def same_module(dense: nn.Module, pruned: nn.Module) -> bool:
    """True if both modules hold equal parameters and buffers (torch.equal, names and shapes)."""
    if dense is pruned:
        return True
    if type(dense) is not type(pruned):
        return False
    left, right = dense.state_dict(), pruned.state_dict()
    return left.keys() == right.keys() and all(
        left[name].shape == right[name].shape and torch.equal(left[name], right[name]) for name in left
    )


def branch_paths(adapter: FamilyAdapter, sublayer: str) -> tuple[str, ...]:
    """Paths (inside a block) of the linears a sublayer swaps."""
    if sublayer == "attention":
        return adapter.attn_reader_paths + adapter.attn_writer_paths
    if sublayer == "mlp":
        return adapter.mlp_reader_paths + adapter.mlp_writer_paths
    raise ValueError(f"unknown sublayer {sublayer!r}; known: {', '.join(SUBLAYERS)}")


@contextmanager
def swapped(block: nn.Module, source: nn.Module, paths: Sequence[str]) -> Any:
    """Temporarily put source's modules at `paths` into `block`."""
    originals = [(path, get_path(block, path)) for path in paths]
    try:
        for path in paths:
            set_path(block, path, get_path(source, path))
        yield block
    finally:
        for path, module in originals:
            set_path(block, path, module)


class _BlockCall:
    """One captured call of a decoder block: its hidden-state input, other arguments and output."""

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        if args:
            self.hidden, self.args, self.kwargs = args[0], args[1:], dict(kwargs)
            self.by_name = False
        else:
            self.hidden, self.args, self.kwargs = kwargs["hidden_states"], (), dict(kwargs)
            self.by_name = True
        self.output = block_hidden(output).detach()  # (1, T, D)

    def run(self, block: nn.Module, hidden: torch.Tensor | None = None) -> torch.Tensor:
        """`block` on this call's input (or `hidden` in its place) and arguments."""
        hidden = self.hidden if hidden is None else hidden
        if self.by_name:
            return block_hidden(block(**{**self.kwargs, "hidden_states": hidden}))
        return block_hidden(block(hidden, *self.args, **self.kwargs))

    def run_mapped(self, block: nn.Module, basis_in: torch.Tensor, basis_out: torch.Tensor) -> torch.Tensor:
        """A sliced block on this call's input mapped into its basis (x B_in), its output mapped back;
        the bases float64 on the input's device (`_bases_on`)."""
        x = self.hidden
        out = self.run(block, (x.double() @ basis_in).to(x.dtype))
        return (out.double() @ basis_out.T).to(x.dtype)


def _capture_blocks(adapter: FamilyAdapter, model: nn.Module, ids: torch.Tensor) -> list[_BlockCall]:
    """Every block's call during one forward of the model's decoder on ids (T,)."""
    blocks = adapter.blocks(model)
    calls: list[_BlockCall | None] = [None] * len(blocks)

    def hook_for(index: int) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            calls[index] = _BlockCall(args, kwargs, output)

        return hook

    handles = [
        block.register_forward_hook(hook_for(index), with_kwargs=True) for index, block in enumerate(blocks)
    ]
    try:
        adapter.decoder(model)(input_ids=ids[None], use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    missing = [index for index, call in enumerate(calls) if call is None]
    if missing:
        raise RuntimeError(f"blocks {missing} did not run during the dense forward")
    return [call for call in calls if call is not None]


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
    progress: ProgressCallback | None = None,
    should_stop: StopCheck | None = None,
) -> list[ProbeRecord]:
    """Per dense layer and sublayer, the shift of the layer's output when only that sublayer is
    pruned, on the dense input. Records at probe "counterfactual": embedding and logits spaces
    ("1-cos" with estimate, "dpar", "dperp") and probs space ("1-cos", "kl", with estimates).

    `bases` (a sliced model's `SlicingReport.bases`) compares a SliceGPT model block by block
    (module docstring); without them, ValueError when the two streams differ in width or basis.
    """
    for sublayer in sublayers:
        if sublayer not in SUBLAYERS:
            raise ValueError(f"unknown sublayer {sublayer!r}; known: {', '.join(SUBLAYERS)}")
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
    total, done = len(input_ids) * len(dense_blocks), 0
    for ids in input_ids:
        calls = _capture_blocks(adapter, dense, ids.to(device))
        for layer, steps in enumerate(plan):
            if should_stop is not None and should_stop():
                raise ProbeStopped(f"stopped before layer {layer}")
            call, target = calls[layer], layer_map[layer]
            pruned_block = None if target is None else pruned_blocks[target]
            outputs = {
                sublayer: (
                    call.run_mapped(pruned_blocks[layer], bases[layer], bases[layer + 1])
                    if how == "mapped" and bases is not None
                    else _sublayer_output(adapter, call, how, sublayer, dense_blocks[layer], pruned_block)
                )
                for sublayer, how in steps.items()
            }
            _measure(sums, adapter, dense, layer, call.output, outputs, temperature)
            done += 1
            if progress is not None:
                progress(done, total)
    return sums.records()


def _sublayer_output(
    adapter: FamilyAdapter,
    call: _BlockCall,
    how: str,
    sublayer: str,
    dense_block: nn.Module,
    pruned_block: nn.Module | None,
) -> torch.Tensor:
    """The layer's output with only `sublayer` pruned, as the plan says to get it: the input
    ("identity": the block was removed), the dense output ("same": untouched), the pruned block's
    output ("pruned"), or a hybrid block with that branch swapped in ("swap")."""
    if how == "identity":
        return call.hidden
    if how == "same":
        return call.output
    assert pruned_block is not None
    if how == "pruned":
        return call.run(pruned_block)
    with swapped(dense_block, pruned_block, branch_paths(adapter, sublayer)) as hybrid:
        return call.run(hybrid)


def _measure(
    sums: RecordSums,
    adapter: FamilyAdapter,
    dense: nn.Module,
    layer: int,
    output: torch.Tensor,
    counterfactuals: dict[str, torch.Tensor],
    temperature: float,
) -> None:
    """Add the shifts output -> each counterfactual at one layer, first position left out."""
    if not counterfactuals:
        return
    y = output[0, 1:]  # (T-1, D): the attention sink's position left out
    shifted = {sublayer: value[0, 1:] for sublayer, value in counterfactuals.items()}
    hidden = VectorReference.of(y)
    for sublayer, y2 in shifted.items():
        sums.add_deviations("embedding", vector_deviations(y, y2, hidden), layer=layer, sublayer=sublayer)
    norm, head = adapter.final_norm(dense), adapter.lm_head(dense)
    for rows in token_chunks(y.shape[0], head.out_features):
        z = head(norm(y[rows]))  # (n, V): the dense logits of this layer, shared by every sublayer
        logits, distribution = VectorReference.of(z), DistributionReference.of(z, temperature)
        for sublayer, y2 in shifted.items():
            z2 = z if counterfactuals[sublayer] is output else head(norm(y2[rows]))  # same: y' = y
            sums.add_deviations("logits", vector_deviations(z, z2, logits), layer=layer, sublayer=sublayer)
            sums.add_deviations(
                "probs",
                probability_deviations(z, z2, temperature, distribution),
                layer=layer,
                sublayer=sublayer,
            )
