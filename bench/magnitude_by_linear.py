"""Where per-layer magnitude pruning breaks a model: one linear type at a time (issue 11).

Usage (from the repository root; Gemma needs its packaged wheels, see README.md):

    HF_HUB_OFFLINE=1 .venv/bin/python bench/magnitude_by_linear.py --models smollm2-135m gemma-3-270m

For each model (fp32, CPU), prunes with `magnitude` (one |W| threshold per layer) at `--sparsity`
either one linear type in every block (q_proj in all blocks, then k_proj...) or every linear, each
time on a fresh dense copy, and measures the perplexity on the first `--windows` WikiText-2 test
windows of 512. Beside it, each type's own output-error share ||dW X||^2 / ||W X||^2 summed over
its blocks, on the dense inputs of the first two windows: the quantity magnitude's predictor
aggregates. The question it answers: is a model that collapses sooner (Gemma-3-270m) losing more
at the linears, or paying more downstream per unit of the same loss? Writes
bench/out/magnitude_by_linear.json (git-ignored) and prints it.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

import harness
import torch

from core.settings import Settings
from workers.architectures import detect_family
from workers.evaluation.perplexity import perplexity
from workers.loading import refresh_model
from workers.pruning.linears import block_linears, weight_out_in
from workers.pruning.magnitude import magnitude_scores, prune_linear_by_magnitude
from workers.pruning.masks import UNSTRUCTURED, layer_mask

SEQLEN = 512
SHARE_WINDOWS = 2


def typed_linears(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(type, module) of every prunable linear, the type being the last part of its name."""
    adapter = detect_family(model)
    return [
        (name.rsplit(".", 1)[-1], module)
        for block in adapter.blocks(model)
        for name, module in block_linears(adapter, block)
    ]


@torch.no_grad()
def output_error_shares(model: torch.nn.Module, windows: torch.Tensor, sparsity: float) -> dict[str, float]:
    """Per linear type: sum ||dW X||^2 / sum ||W X||^2 over its blocks, dW the weights the
    per-layer rule prunes, X the dense inputs of `windows`."""
    sums: dict[str, list[float]] = {}
    handles = []
    for kind, module in typed_linears(model):
        weight = weight_out_in(module).detach()  # (out, in)
        pruned = weight * layer_mask(magnitude_scores(weight), sparsity)  # dW

        def record(_module: Any, inputs: tuple[torch.Tensor, ...], _output: Any, kind: str = kind,
                   weight: torch.Tensor = weight, pruned: torch.Tensor = pruned) -> None:  # fmt: skip
            rows = inputs[0].reshape(-1, inputs[0].shape[-1]).float()  # (tokens, in)
            entry = sums.setdefault(kind, [0.0, 0.0])
            entry[0] += float((rows @ pruned.T).pow(2).sum())
            entry[1] += float((rows @ weight.T).pow(2).sum())

        handles.append(module.register_forward_hook(record))
    try:
        for row in windows:
            model(input_ids=row[None])
    finally:
        for handle in handles:
            handle.remove()
    return {kind: lost / kept for kind, (lost, kept) in sums.items()}


def measure(model_name: str, args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    loaded = harness.load_dense(model_name, settings)
    windows = harness.wikitext_ids(loaded, settings)[: args.windows * SEQLEN].view(args.windows, SEQLEN)

    def nll() -> float:
        return perplexity(loaded.model, windows.reshape(-1), seqlen=SEQLEN, max_windows=args.windows).nll_mean

    shares = output_error_shares(loaded.model, windows[:SHARE_WINDOWS], args.sparsity)
    dense = nll()
    delta: dict[str, float] = {}
    for only in [*shares, "all"]:
        refresh_model(loaded)
        for kind, module in typed_linears(loaded.model):
            if only in ("all", kind):
                prune_linear_by_magnitude(module, args.sparsity, UNSTRUCTURED)
        delta[only] = nll() - dense
        print(
            model_name,
            only,
            f"share {shares.get(only, float('nan')):.4f}",
            f"dNLL {delta[only]:.4f}",
            flush=True,
        )
    return {
        "dense_ppl": math.exp(dense),
        "output_error_share": shares,
        "delta_nll": delta,
        "delta_nll_per_share": {kind: delta[kind] / share for kind, share in shares.items()},
        "sum_of_types_over_all": sum(delta[kind] for kind in shares) / delta["all"],
    }


def main() -> None:
    made = harness.parser(__doc__, "magnitude_by_linear")
    harness.add_models_args(made)
    made.add_argument("--sparsity", type=float, default=0.4)
    made.add_argument("--windows", type=int, default=8)
    args, settings = harness.parse_engine(made)
    result = harness.start_report(
        protocol={
            "method": "magnitude (per layer)",
            "sparsity": args.sparsity,
            "windows": args.windows,
            "seqlen": SEQLEN,
            "share_windows": SHARE_WINDOWS,
            "dtype": "float32",
            "threads": args.threads,
        }
    )
    result["models"] = {name: measure(name, args, settings) for name in args.models}
    harness.finish_report(args.out, result)
    print(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
