"""Each linear's input statistic, recorded by forward pre-hooks while its block runs.

The pruners that need data (Wanda, SparseGPT) and the profile's mask errors
(`workers.profiling.mask_errors`) read the same thing: per block linear, a running statistic of the
token rows it is called on (padded positions left out). The hooks fire however the block is run
(a plain forward, or slicing's branch-by-branch wrappers), so the caller keeps its own loop.

Linears called on the same tensor (q/k/v on the attention norm's output, gate/up on the MLP norm's)
share one statistic, computed once: one Hessian for q, k and v instead of three equal ones. Sharing
is found by identity of the input tensor within each batch (each first input is held until the
batch ends, so its memory cannot be reused by a later, different input) and must be the same in
every batch.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol

import torch
from torch import nn

from workers.pruning.stream import token_rows


class InputStatistic(Protocol):
    """Something that accumulates a linear's inputs, token rows (n, in) at a time; `keep` (n,)
    marks the rows that are real tokens."""

    def add(self, rows: torch.Tensor, keep: torch.Tensor | None = None) -> None: ...


NewStatistic = Callable[[int, torch.device], InputStatistic]  # (input features, device) -> statistic


class InputRecorder:
    """Hooks on `linears` while entered; call `start(keep)` before each batch runs through the block,
    and `statistics(index)` after the last one."""

    def __init__(
        self, linears: list[tuple[str, nn.Module]], new_statistic: NewStatistic, compute: torch.device
    ) -> None:
        self.linears = linears
        self.new_statistic = new_statistic
        self.compute = compute
        self._statistics: dict[str, InputStatistic] = {}
        self._reads_from: dict[str, str] = {}  # path -> the path whose statistic it shares (itself if first)
        self._current: dict[str, Any] = {}  # the running batch's keep mask and inputs seen so far
        self._handles: list[torch.utils.hooks.RemovableHandle] = []

    def __enter__(self) -> InputRecorder:
        self._handles = [module.register_forward_pre_hook(self._hook(path)) for path, module in self.linears]
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._current.clear()
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def start(self, keep: torch.Tensor) -> None:
        """The next batch's keep mask (B, T): True at real tokens."""
        self._current.update(keep=keep, seen={})

    def _hook(self, path: str) -> Callable[[nn.Module, tuple[Any, ...]], None]:
        def record(_module: nn.Module, args: tuple[Any, ...]) -> None:
            inputs = args[0]
            owner, _ = self._current["seen"].setdefault(id(inputs), (path, inputs))
            if self._reads_from.setdefault(path, owner) != owner:
                raise RuntimeError(f"{path} shared its input with {owner} in one batch and not in another")
            if owner != path:
                return
            if path not in self._statistics:
                self._statistics[path] = self.new_statistic(inputs.shape[-1], self.compute)
            self._statistics[path].add(*token_rows(inputs, self._current["keep"]))  # rows (n, in), keep (n,)

        return record

    def statistics(self, index: int) -> dict[str, InputStatistic]:
        """Each linear's statistic (shared ones under every path that reads them); RuntimeError
        naming the linears that never ran in block `index`."""
        silent = [path for path, _ in self.linears if path not in self._reads_from]
        if silent:
            raise RuntimeError(f"block {index}: {', '.join(silent)} never ran on the calibration batches")
        return {path: self._statistics[self._reads_from[path]] for path, _ in self.linears}

    def owners(self) -> dict[str, str]:
        """path -> the path whose statistic it shares (itself when it owns one)."""
        return dict(self._reads_from)
