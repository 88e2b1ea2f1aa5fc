"""A simulated point's windows scored in bfloat16, corrected by the dense model's gap.

To a precision, a face value's windows run through its whole simulated model (`whole_models`), one
forward per window; that is most of what a curve to a precision costs (bench/README.md,
`precision_curves.py`). Where the device multiplies bfloat16 natively and the model is float32, those
windows run on a bfloat16 copy of the model instead, and each window's value is corrected by what
bfloat16 does to the dense model on that very window:

    nll_i = simulated_bf16_i - (dense_bf16_i - dense_i)

so the paired difference to the dense model is taken within one dtype (`dense_i` is the stored
float32 baseline). What is left is the difference between what bfloat16 does to the pruned and to the
dense model on a window, a bias the band does not cover: measured in `bench/window_dtype.py` (see
docs/science.md, "Simulated curves") before it became SliceGPT's default. Without anchors the pilot
runs on the copy too, the simulation's pass then only making the bases or the statistics
(`workers.kinds.simulate_windows`); every anchor and the pilot it rests on stay in the model's dtype.

A mask method's windows go on the copy only when the job asks (`window_dtype`): its simulation is
otherwise the method itself, exactly. Its masks are still picked on the model's own weights (a
bfloat16 weight would reorder near-ties), and the copy takes the masked weights, cast, for the
length of the point (`masked_scorer`).

The dense model's values in the copy's dtype depend only on the baseline, so a job starts from those
a store already holds (`known`) and hands back those it scored (`dense_scored`) to be kept
(`workers.kinds.dense_windows`).

Memory: the copy is half the float32 model (a mask point adds its masked linears in the copy's dtype);
it is made only where the model is resident (an offloaded model has no room for one) and dropped when
the curve is done.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from core.prediction.paired_windows import WindowScorer
from workers.architectures import FamilyAdapter
from workers.evaluation.sampled_perplexity import window_scorer
from workers.offload import offloaded
from workers.pruning.linears import linear_weights
from workers.simulation.streams_dtype import resolve_streams_dtype
from workers.simulation.whole_models import MaskedModel, ProjectedModel

CUDA_HEADROOM = 2.0
"""On a GPU the copy is made only where free memory holds this many float32 copies of the model
(the float32 copy `deepcopy` makes before the cast, and room to run)."""


def resolve_window_dtype(asked: str | None, model: nn.Module, device: torch.device) -> torch.dtype | None:
    """The further windows' dtype where it differs from the model's (None: the model's own). `asked` is
    the job's `window_dtype`; null picks bfloat16 for a float32 model on a device that computes it
    natively. Either way a copy is made only where the model is resident with room for it (else the
    model's own dtype, which the row then records)."""
    wanted = resolve_streams_dtype(asked, next(model.parameters()).dtype, device)  # the same rule
    return None if wanted is None or not _room_for_copy(model, device) else wanted


def _room_for_copy(model: nn.Module, device: torch.device) -> bool:
    if offloaded(model) is not None:
        return False
    if device.type != "cuda":
        return True
    size = sum(parameter.numel() * parameter.element_size() for parameter in model.parameters())
    free, _ = torch.cuda.mem_get_info(device)
    return free >= CUDA_HEADROOM * size


class CheapWindows:
    """The dense model copied into `dtype`, and the per-window gap it has to the model's own values.
    `known`: the dense model's mean NLL in `dtype` on windows scored before (by index)."""

    def __init__(
        self,
        model: nn.Module,
        dtype: torch.dtype,
        windows: torch.Tensor,
        dense_window_nll: Sequence[float],
        *,
        batch_size: int = 1,
        should_stop: Callable[[], bool] | None = None,
        known: Mapping[int, float] | None = None,
    ) -> None:
        if len(dense_window_nll) != windows.shape[0]:
            raise ValueError(f"{len(dense_window_nll)} dense window values for {windows.shape[0]} windows")
        self.dtype = dtype
        self._model = model
        self._windows = windows
        self._batch_size = batch_size
        self._should_stop = should_stop
        self._copy: nn.Module | None = None  # made on the first window it scores
        self._dense = dense_window_nll
        self._known = dict(known or {})
        self.dense_scored: dict[int, float] = {}  # the dense model's values this object scored
        self._gap: dict[int, float] = {}
        self.windows_scored = 0  # simulated windows, corrected
        self.seconds = 0.0  # the copy, the dense windows and the corrected ones
        self.dense_seconds = 0.0  # of which the copy and the dense windows (the correction's cost)
        self._masked: tuple[FamilyAdapter, list[torch.Tensor]] | None = None  # a mask point's weights
        self._copy_masked = False  # whether the copy holds them now

    @property
    def model(self) -> nn.Module:
        """The copy of the dense model in `dtype` (made on first use; the job's model is not touched)."""
        if self._copy is None:
            self._copy = copy.deepcopy(self._model).to(self.dtype)
        return self._copy

    def _score(self, indices: Sequence[int]) -> Sequence[float]:
        scorer = window_scorer(
            self.model, self._windows, batch_size=self._batch_size, should_stop=self._should_stop
        )
        return scorer(indices)

    def scorer(self, simulated: ProjectedModel) -> WindowScorer:
        """Scores windows by index on `simulated` in this dtype, each corrected by the dense gap."""

        def score(indices: Sequence[int]) -> Sequence[float]:
            with simulated.applied(self.model):
                return self._score(indices)

        return self._corrected(score)

    def _corrected(self, score: WindowScorer) -> WindowScorer:
        """`score` (the simulated windows on the copy), each window less its dense gap, counted."""

        def corrected(indices: Sequence[int]) -> list[float]:
            gaps = self.gaps(indices)
            started = time.perf_counter()
            values = score(indices)
            self.windows_scored += len(indices)
            self.seconds += time.perf_counter() - started
            return [value - gap for value, gap in zip(values, gaps, strict=True)]

        return corrected

    @contextmanager
    def masked_scorer(self, simulated: MaskedModel) -> Iterator[WindowScorer]:
        """Scores windows by index on `simulated` in this dtype, each corrected by the dense gap: the
        masks picked on the model's own weights, the copy holding them cast for the `with`."""
        _ = self.model  # the copy is made from the dense model, before any mask
        with simulated.applied(self._model):
            weights = linear_weights(simulated.adapter, self._model)
            masked = [weight.to(self.dtype, copy=True) for weight in weights]
        self._masked = (simulated.adapter, masked)

        def score(indices: Sequence[int]) -> Sequence[float]:
            self._hold(masked=True)  # after the gaps: the dense copy may have scored a window
            return self._score(indices)

        try:
            yield self._corrected(score)
        finally:
            self._hold(masked=False)
            self._masked = None

    def _hold(self, *, masked: bool) -> None:
        """Put the mask point's weights in the copy, or the dense ones back (cast from the model's,
        which is how the copy was made, so the copy is again what it was)."""
        if self._masked is None or masked == self._copy_masked:
            return
        adapter, weights = self._masked
        source = weights if masked else linear_weights(adapter, self._model)
        with torch.no_grad():
            for target, value in zip(linear_weights(adapter, self.model), source, strict=True):
                target.copy_(value)
        self._copy_masked = masked

    def gaps(self, indices: Sequence[int]) -> list[float]:
        """dense_dtype_i - dense_i for each window, the dense copy scored once per window (never for a
        window in `known`)."""
        started = time.perf_counter()
        missing = [index for index in indices if index not in self._known and index not in self.dense_scored]
        if missing:
            self._hold(masked=False)
            self.dense_scored.update(zip(missing, self._score(missing), strict=True))
        for index in indices:
            if index not in self._gap:
                value = self._known[index] if index in self._known else self.dense_scored[index]
                self._gap[index] = value - self._dense[index]
        elapsed = time.perf_counter() - started
        self.seconds += elapsed
        self.dense_seconds += elapsed
        return [self._gap[index] for index in indices]

    @property
    def ran(self) -> bool:
        """Whether any window was scored on the copy."""
        return self._copy is not None

    @property
    def dense_windows(self) -> int:
        """How many windows the dense copy has scored (each once)."""
        return len(self.dense_scored)

    @property
    def dense_reused(self) -> int:
        """How many of the windows corrected took the dense value from `known`."""
        return sum(index in self._known for index in self._gap)
