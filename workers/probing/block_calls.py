"""One dense forward with every block's call captured, and single blocks re-run on those inputs:
what the local counterfactual (`workers.probing.counterfactual`) is built from. A block re-runs with
its own forward and captured arguments, so every family's forward stays the one HF wrote; modules
are swapped in by path for the length of a `with`.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from workers.architectures import FamilyAdapter
from workers.probing.common import block_hidden
from workers.slicing.portable.sliced_modules import get_path, set_path


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
        self.mid: torch.Tensor | None = None  # (1, T, D): the dense mid-stream, for sequential blocks

    def run(self, block: nn.Module, hidden: torch.Tensor | None = None) -> torch.Tensor:
        """`block` on this call's input (or `hidden` in its place) and arguments."""
        hidden = self.hidden if hidden is None else hidden
        if self.by_name:
            return block_hidden(block(**{**self.kwargs, "hidden_states": hidden}))
        return block_hidden(block(hidden, *self.args, **self.kwargs))

    def mid_stream(self, block: nn.Module, adapter: FamilyAdapter) -> torch.Tensor:
        """x + attn(norm(x)) of `block` on this call's input, the attention sublayer's output: what
        the block's own forward feeds its MLP norm (Gemma's pre-feedforward norm, after the attention's
        output norm), captured by a hook."""
        found: list[torch.Tensor] = []

        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            found.append(args[0])

        handle = adapter.mlp_norm(block).register_forward_pre_hook(hook)
        try:
            self.run(block)
        finally:
            handle.remove()
        return found[0].reshape(self.output.shape)  # (1, T, D): OPT flattens the tokens there

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

    mids: dict[int, torch.Tensor] = {}

    def mid_hook_for(index: int) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            mids[index] = args[0].detach()

        return hook

    handles = [
        block.register_forward_hook(hook_for(index), with_kwargs=True) for index, block in enumerate(blocks)
    ]
    handles += [
        adapter.mlp_norm(block).register_forward_pre_hook(mid_hook_for(index))
        for index, block in enumerate(blocks)
        if not adapter.is_parallel(block)
    ]
    try:
        adapter.decoder(model)(input_ids=ids[None], use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    missing = [index for index, call in enumerate(calls) if call is None]
    if missing:
        raise RuntimeError(f"blocks {missing} did not run during the dense forward")
    found = [call for call in calls if call is not None]
    for index, mid in mids.items():
        found[index].mid = mid.reshape(found[index].output.shape)  # OPT flattens the tokens there
    return found
