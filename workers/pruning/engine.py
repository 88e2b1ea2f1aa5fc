"""`prune_model`: one entry point for every pruner besides SliceGPT, and the report it returns.

Intra-layer methods zero individual weights of every block linear (embeddings and head stay dense):
"magnitude" (no data), "wanda" and "sparsegpt" (calibrated block by block), each with pattern
"unstructured" (floor(sparsity * in) per output row) or N:M ("2:4", "4:8": N of every M input
columns per row, so sparsity must be N / M). Drop methods remove whole pieces of n = round(sparsity
* L) layers: "attention-drop" and "mlp-drop" (one branch per layer, see layer_drop) and "shortgpt"
(whole blocks, see shortgpt). Everything happens in place on the model.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel

from core.methods import METHODS, MethodKind, methods_of
from workers.architectures import FamilyAdapter, match_structure
from workers.block_inputs import home_device
from workers.pruning import layer_drop, shortgpt
from workers.pruning.linears import block_linears, prunable_counts
from workers.pruning.masks import PATTERNS, UNSTRUCTURED, pattern_sparsity
from workers.pruning.rules import LINEAR_RULES
from workers.pruning.sequential import prune_sequentially
from workers.pruning.stream import (
    ProgressCallback,
    StopCheck,
    capture,
    check_calibration,
    walk_blocks,
)


@dataclass
class PruningReport:
    """What pruning did, for the job's results and the artifact's prunecast_pruning.json."""

    method: str
    pattern: str | None  # None for drop methods
    sparsity: float  # as requested: fraction of weights per row (intra-layer) or of layers (drops)
    achieved_sparsity: float  # measured: zeroed prunable weights / prunable weights, or dropped / L
    params_before: int  # unique parameters of the dense model (a tied head counted once)
    params_after: int  # intra-layer: minus zero weights; drops: parameters of what remains
    num_layers: int  # L of the dense model
    dropped_layers: list[int] = field(default_factory=list)  # dense indices, ascending
    layer_map: list[int | None] = field(default_factory=list)  # dense index -> pruned index (None: removed)
    scores: list[float] = field(default_factory=list)  # per dense layer: cosine or BI; empty intra-layer
    family: str = ""  # adapter that recognised the structure
    calibration_tokens: int = 0  # unpadded tokens the statistics saw (0 for magnitude)

    @property
    def param_fraction_removed(self) -> float:
        """1 - after / before."""
        return 1.0 - self.params_after / self.params_before

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["param_fraction_removed"] = self.param_fraction_removed
        return data


def count_parameters(model: torch.nn.Module) -> int:
    """Unique parameters (shared ones counted once)."""
    return sum(parameter.numel() for parameter in model.parameters())


def layers_to_drop(sparsity: float, num_layers: int) -> int:
    """n = round(sparsity * L) for drop methods (Python's round: halves go to the even integer, as in
    core.methods.layers_dropped); raises ValueError unless 0 <= n < L."""
    if not 0.0 <= sparsity < 1.0:
        raise ValueError(f"sparsity for a drop method is the fraction of layers, in [0, 1); got {sparsity}")
    count = round(sparsity * num_layers)
    if count >= num_layers:
        raise ValueError(
            f"sparsity {sparsity} drops {count} of {num_layers} layers, leaving none; pass a sparsity below "
            f"{(num_layers - 0.5) / num_layers:.4g}"
        )
    return count


def validate(method: str, sparsity: float, pattern: str | None) -> str | None:
    """The pattern to use (None for drops); raises ValueError with the fix for bad combinations."""
    entry = METHODS.get(method)
    if entry is None or entry.kind is MethodKind.slicing:
        raise ValueError(f"unknown pruning method {method!r}; use one of: {', '.join(ENGINES)}")
    if not isinstance(sparsity, int | float) or math.isnan(sparsity):
        raise ValueError(f"sparsity must be a number, got {sparsity!r}")
    if entry.kind is MethodKind.drop:
        if pattern not in (None, UNSTRUCTURED):
            raise ValueError(
                f"method {method!r} drops whole layers and takes no sparsity pattern; got pattern "
                f"{pattern!r}: leave pattern unset or use an intra-layer method "
                f"({', '.join(methods_of(MethodKind.intra_layer))})"
            )
        return None
    pattern = UNSTRUCTURED if pattern is None else pattern
    if pattern not in PATTERNS:
        raise ValueError(f"unknown sparsity pattern {pattern!r}; use one of: {', '.join(PATTERNS)}")
    if not 0.0 <= sparsity < 1.0:
        raise ValueError(f"sparsity is the fraction of weights to zero, in [0, 1); got {sparsity}")
    required = pattern_sparsity(pattern)
    if required is not None and abs(sparsity - required) > 1e-9:
        raise ValueError(
            f"pattern {pattern} zeroes exactly {required:g} of the weights; pass sparsity={required:g} "
            "or use pattern 'unstructured'"
        )
    return pattern


@torch.no_grad()
def prune_model(
    model: PreTrainedModel,
    method: str,
    sparsity: float,
    *,
    pattern: str | None = UNSTRUCTURED,
    calibration_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    batch_size: int = 8,
    device: torch.device | str | None = None,
    progress: ProgressCallback | None = None,
    should_stop: StopCheck | None = None,
) -> PruningReport:
    """Prune `model` in place with `method` at `sparsity`; return what was done.

    `calibration_ids` (N, T) and `attention_mask` (N, T, 1 = real token; None: all real) are
    required for every method but magnitude; padded positions never enter a statistic. Only the
    block being worked on moves to `device` (default: where the model is). `progress(done, L)` is
    called with 0 first and after each block; `should_stop()` is checked before each block and
    raises PruningStopped (the partly pruned model must be discarded). Bad arguments raise
    ValueError saying what to change; unrecognised models raise UnsupportedArchitectureError.
    """
    pattern = validate(method, sparsity, pattern)
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    entry, engine = METHODS[method], ENGINES[method]
    adapter = match_structure(model)
    blocks = adapter.blocks(model)
    num_layers = len(blocks)
    drop_count = layers_to_drop(sparsity, num_layers) if entry.kind is MethodKind.drop else 0
    if engine.refusal is not None and (reason := engine.refusal(model)) is not None:
        raise ValueError(reason)
    keep: torch.Tensor | None = None
    if entry.calibrated:
        if calibration_ids is None:
            free = [repr(name) for name in ENGINES if not METHODS[name].calibrated]
            raise ValueError(
                f"method {method!r} needs calibration_ids (N, T); only {', '.join(free)} "
                f"{'runs' if len(free) == 1 else 'run'} without data"
            )
        keep = check_calibration(calibration_ids, attention_mask)

    model.eval()
    home = home_device(model)
    compute = torch.device(device) if device is not None else home
    params_before = count_parameters(model)
    report = PruningReport(
        method=method,
        pattern=pattern,
        sparsity=float(sparsity),
        achieved_sparsity=0.0,
        params_before=params_before,
        params_after=params_before,
        num_layers=num_layers,
        layer_map=list(range(num_layers)),
        family=adapter.name,
        calibration_tokens=0 if keep is None else int(keep.sum()),
    )
    batches: list[Any] = []
    if keep is not None:
        assert calibration_ids is not None
        batches = capture(model, adapter, calibration_ids, keep, batch_size, compute, home)
    run = _Run(
        model, adapter, blocks, batches, sparsity, pattern, drop_count, compute, home, progress, should_stop
    )
    engine.prune(run, report)
    batches.clear()
    if entry.kind is MethodKind.intra_layer:
        total, zeros = prunable_counts(adapter, model)
        report.achieved_sparsity = zeros / total
        report.params_after = params_before - zeros
    else:
        report.achieved_sparsity = len(report.dropped_layers) / num_layers
    return report


@dataclass
class _Run:
    """What a method's engine works with."""

    model: PreTrainedModel
    adapter: FamilyAdapter
    blocks: torch.nn.ModuleList
    batches: list[Any]  # block 0's calibration inputs (empty for data-free methods)
    sparsity: float
    pattern: str | None
    drop_count: int  # drop methods: n = round(sparsity * L)
    compute: torch.device
    home: torch.device
    progress: ProgressCallback | None
    should_stop: StopCheck | None


@dataclass(frozen=True)
class MethodEngine:
    """How one method prunes (in place, filling the report), and what it refuses up front."""

    prune: Callable[[_Run, PruningReport], None]
    refusal: Callable[[PreTrainedModel], str | None] | None = None


def _intra_layer(method: str) -> Callable[[_Run, PruningReport], None]:
    """Apply `method`'s rule (`workers.pruning.rules`) to every block linear: data-free rules block by
    block, the others on the calibration stream as it leaves the already pruned blocks."""
    rule = LINEAR_RULES[method]

    def prune(run: _Run, report: PruningReport) -> None:
        pattern = run.pattern
        assert pattern is not None
        if rule.statistic is None:
            for _, block in walk_blocks(
                run.blocks,
                compute=run.compute,
                home=run.home,
                progress=run.progress,
                should_stop=run.should_stop,
            ):
                for _, module in block_linears(run.adapter, block):
                    rule.prune(module, None, run.sparsity, pattern)
            return
        prune_sequentially(
            run.adapter,
            run.blocks,
            run.batches,
            rule.statistic,
            lambda module, statistic: rule.prune(module, statistic, run.sparsity, pattern),
            compute=run.compute,
            progress=run.progress,
            should_stop=run.should_stop,
        )

    return prune


def _branch_drop(branch: str) -> Callable[[_Run, PruningReport], None]:
    """Zero the output weights of the `branch` ("attention" or "mlp") of the layers whose branch
    changes the residual stream least (the same function, the same layer count)."""

    def drop(run: _Run, report: PruningReport) -> None:
        both = layer_drop.branch_cosines(
            run.adapter,
            run.blocks,
            run.batches,
            compute=run.compute,
            progress=run.progress,
            should_stop=run.should_stop,
        )
        report.scores = both.attention if branch == "attention" else both.mlp
        report.dropped_layers = layer_drop.choose_dropped(report.scores, run.drop_count)
        removed: dict[int, torch.nn.Parameter] = {}
        for index in report.dropped_layers:
            layer_drop.zero_branch(run.adapter, run.blocks[index], branch)
            for parameter in layer_drop.branch_parameters(run.adapter, run.blocks[index], branch):
                removed[id(parameter)] = parameter
        report.params_after = report.params_before - sum(parameter.numel() for parameter in removed.values())

    return drop


def _shortgpt(run: _Run, report: PruningReport) -> None:
    influence = shortgpt.block_influence(
        run.blocks, run.batches, compute=run.compute, progress=run.progress, should_stop=run.should_stop
    )
    report.scores = influence
    report.dropped_layers = shortgpt.choose_removed(influence, run.drop_count)
    report.layer_map = shortgpt.remove_blocks(run.model, run.adapter, report.dropped_layers)
    report.params_after = count_parameters(run.model)


ENGINES: dict[str, MethodEngine] = {
    **{name: MethodEngine(_intra_layer(name)) for name in LINEAR_RULES},
    "attention-drop": MethodEngine(_branch_drop("attention")),
    "mlp-drop": MethodEngine(_branch_drop("mlp")),
    "shortgpt": MethodEngine(_shortgpt, refusal=shortgpt.renumbering_refusal),
}
"""Every method of `core.methods` that is not slicing, by name: its engine here."""
if set(ENGINES) != {name for name, entry in METHODS.items() if entry.kind is not MethodKind.slicing}:
    raise AssertionError("workers.pruning.engine.ENGINES must cover the registry's non-slicing methods")
