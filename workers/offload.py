"""Offloaded execution: a model larger than the device runs with its blocks streamed through it.

The plan (`plan_memory`) compares the model's bytes with the device's budget: the free memory of
a CUDA device, or `PRUNECAST_DEVICE_MEMORY_BYTES` where set (which also lets a CPU host rehearse
the offloaded path). A job asks for `offload`: "auto" (offload only when the model does not fit in
RESIDENT_SHARE of the budget, the rest being left for activations), "always" or "never".

Offloaded, the model's home is the CPU. Everything the decoder owns besides its blocks
(embeddings, rotary tables, final norm) and the LM head are resident on the device; each block
moves to the device just before its forward and back home just after (`Offloaded`), so at most
one block's weights are on the device at a time and every forward (perplexity, accuracy,
generation with a KV cache, probes) runs unchanged. The model's first parameter, the token
embedding, is on the device, so code that finds "the model's device" from it finds the compute
device. Numerics are those of the in-memory run: the same dtype, the same kernels, on the same
device; only where the weights wait between uses differs.

The block-by-block engines (slicing, Wanda, SparseGPT, drops, the profile) move blocks themselves;
`suspended` takes the hooks off and brings the whole model home while they run, and puts them back
(on whatever the engine left: a sliced model's blocks included) afterwards.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch
from torch import nn

from workers.host_weights import HostWeights

OffloadMode = Literal["auto", "always", "never"]
OFFLOAD_MODES: tuple[str, ...] = ("auto", "always", "never")
RESIDENT_SHARE = 0.8  # "auto" keeps a model resident when it takes at most this share of the budget
CPU = torch.device("cpu")
CONFIGURED = "PRUNECAST_DEVICE_MEMORY_BYTES"  # the budget source when the setting gives it


class OffloadError(RuntimeError):
    """The model cannot run on this device even one block at a time; the message says why."""


@dataclass(frozen=True)
class MemoryPlan:
    """Where a job's model lives, and why: recorded in every result's protocol (`memory_plan`)."""

    mode: str  # as asked: auto | always | never
    offloaded: bool
    model_bytes: int  # parameters and buffers, in the job's dtype
    device_budget_bytes: int | None  # None: no budget known (a CPU without a configured budget)
    budget_source: str  # "cuda free memory", "PRUNECAST_DEVICE_MEMORY_BYTES" or "none"
    resident_bytes: int  # what stays on the device when offloaded (embeddings, norms, head)
    largest_block_bytes: int
    reason: str
    host_weights: HostWeights | None = None  # the host copy: read into memory, mapped, or none

    def record(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def configured_budget(self) -> int | None:
        """The budget the setting gave, to plan another copy of the model with (else None: a CUDA
        device's free memory is read again, with this copy already on it)."""
        return self.device_budget_bytes if self.budget_source == CONFIGURED else None


def module_bytes(module: nn.Module) -> int:
    """Bytes of a module's parameters and buffers (shared tensors counted once)."""
    seen: dict[int, int] = {}
    for tensor in [*module.parameters(), *module.buffers()]:
        seen[id(tensor)] = tensor.numel() * tensor.element_size()
    return sum(seen.values())


def device_budget(device: torch.device, configured: int | None) -> tuple[int | None, str]:
    """The bytes a job may put on `device`: the configured budget if set, else a CUDA device's free
    memory, else none (a CPU host's memory is the model's home anyway)."""
    if configured is not None:
        return configured, CONFIGURED
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free), "cuda free memory"
    return None, "none"


def plan_memory(
    model: nn.Module, blocks: nn.ModuleList, device: torch.device, mode: str, configured: int | None
) -> MemoryPlan:
    """Decide whether `model` (still on the CPU) runs resident or offloaded on `device`.

    Raises OffloadError when offloading is needed (or asked for) but the resident part plus the
    largest block exceed the budget, and when "never" is asked of a model over the budget.
    """
    if mode not in OFFLOAD_MODES:
        raise ValueError(f"offload must be one of {', '.join(OFFLOAD_MODES)}, got {mode!r}")
    total = module_bytes(model)
    block_sizes = [module_bytes(block) for block in blocks]
    largest = max(block_sizes, default=0)
    resident = total - sum(block_sizes)
    budget, source = device_budget(device, configured)
    fits = budget is None or total <= RESIDENT_SHARE * budget
    if mode == "always":
        offloaded, reason = True, "offload was asked for"
    elif mode == "never" or fits:
        offloaded = False
        reason = (
            "no device budget is known; the model is loaded whole"
            if budget is None
            else f"the model takes {total / budget:.0%} of the device budget"
        )
        if budget is not None and total > budget:
            raise OffloadError(
                f"the model needs {total / 2**30:.2f} GiB and the device budget is {budget / 2**30:.2f} GiB "
                f"({source}); offload 'never' was asked, so it cannot run here: use offload 'auto'"
            )
    else:
        assert budget is not None  # `fits` holds without one
        offloaded = True
        reason = (
            f"the model ({total / 2**30:.2f} GiB) exceeds {RESIDENT_SHARE:.0%} of the device budget "
            f"({budget / 2**30:.2f} GiB, {source}); its blocks are streamed through the device one at a time"
        )
    if offloaded and not block_sizes:
        raise OffloadError(
            "offloading streams a model's decoder blocks through the device, and no family adapter "
            "recognises this model's blocks; run it resident (offload 'never') on a device it fits"
        )
    if offloaded and budget is not None and resident + largest > budget:
        raise OffloadError(
            f"even offloaded the model needs {(resident + largest) / 2**30:.2f} GiB on the device at once "
            f"(embeddings, norms and head {resident / 2**30:.2f} GiB plus its largest block "
            f"{largest / 2**30:.2f} GiB), over the budget of {budget / 2**30:.2f} GiB ({source})"
        )
    return MemoryPlan(
        mode=mode,
        offloaded=offloaded,
        model_bytes=total,
        device_budget_bytes=budget,
        budget_source=source,
        resident_bytes=resident,
        largest_block_bytes=largest,
        reason=reason,
    )


class Offloaded:
    """The hooks that stream `blocks` of `model` through `device` (see the module docstring).

    `on_device` is the set of block indices on the device right now; `peak_on_device` the most
    there were at once (1 for any forward), so tests can check the streaming itself.
    """

    def __init__(self, model: nn.Module, blocks: nn.ModuleList, device: torch.device) -> None:
        self._model = weakref.ref(model)  # the registry's value must not keep its key alive
        self.device = device
        self.on_device: set[int] = set()
        self.peak_on_device = 0
        self._handles: list[Any] = []
        self._install(blocks)

    def _install(self, blocks: nn.ModuleList) -> None:
        for block in blocks:
            block.to(CPU)
        _move_all_but(self.model, blocks, self.device)  # never the whole model: it may not fit
        for index, block in enumerate(blocks):
            self._handles.append(block.register_forward_pre_hook(self._arrive(index)))
            self._handles.append(block.register_forward_hook(self._leave(index)))
        self.blocks = blocks

    def _arrive(self, index: int) -> Any:
        def hook(module: nn.Module, _args: tuple[Any, ...]) -> None:
            module.to(self.device)
            self.on_device.add(index)
            self.peak_on_device = max(self.peak_on_device, len(self.on_device))

        return hook

    def _leave(self, index: int) -> Any:
        def hook(module: nn.Module, _args: tuple[Any, ...], _output: Any) -> None:
            module.to(CPU)
            self.on_device.discard(index)

        return hook

    @property
    def model(self) -> nn.Module:
        model = self._model()
        if model is None:
            raise RuntimeError("the offloaded model no longer exists")
        return model

    def remove(self) -> None:
        """Take the hooks off and bring the whole model home."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.model.to(CPU)


def _move_all_but(module: nn.Module, skipped: nn.Module, device: torch.device) -> None:
    """Move every parameter and buffer of `module` to `device` except those inside `skipped`."""
    for parameter in module.parameters(recurse=False):
        parameter.data = parameter.data.to(device)
    for name, buffer in module.named_buffers(recurse=False):
        module._buffers[name] = buffer.to(device)
    for child in module.children():
        if child is skipped:
            continue
        if any(inner is skipped for inner in child.modules()):
            _move_all_but(child, skipped, device)
        else:
            child.to(device)


_ACTIVE: weakref.WeakKeyDictionary[nn.Module, Offloaded] = weakref.WeakKeyDictionary()


def offload(model: nn.Module, blocks: nn.ModuleList, device: torch.device) -> Offloaded:
    """Stream `model`'s blocks through `device` from now on (the model must be on the CPU)."""
    if model in _ACTIVE:
        raise RuntimeError("this model is already offloaded")
    offloaded = Offloaded(model, blocks, device)
    _ACTIVE[model] = offloaded
    return offloaded


def offloaded(model: nn.Module) -> Offloaded | None:
    """The active offloading of `model`, if any."""
    return _ACTIVE.get(model)


@contextlib.contextmanager
def suspended(
    model: nn.Module, blocks_after: Callable[[nn.Module], nn.ModuleList] | None = None
) -> Iterator[None]:
    """While a block-by-block engine runs: no hooks, the whole model home on the CPU (a model that
    is not offloaded is left as it is). On exit the streaming resumes on the model's blocks as they
    are then, found by `blocks_after(model)` (the engine may have replaced them: a sliced model's
    wrappers, or fewer blocks after ShortGPT)."""
    active = _ACTIVE.pop(model, None)
    if active is None:
        yield
        return
    active.remove()
    try:
        yield
    finally:
        blocks = active.blocks if blocks_after is None else blocks_after(model)
        _ACTIVE[model] = Offloaded(model, blocks, active.device)
