"""The pruners side by side on SmolLM2-135M: perplexity, real parameter fraction removed and time.

Usage (from the repository root):

    HF_HUB_OFFLINE=1 .venv/bin/python bench/prune_smollm2.py
    HF_HUB_OFFLINE=1 .venv/bin/python bench/prune_smollm2.py --methods wanda sparsegpt --windows 2

One process, one calibration set (BoolQ Wikipedia passages, seeded windows) and one perplexity
protocol (WikiText-2 test, seqlen 512, the first windows) for every method, each pruning a fresh
copy of the dense model: magnitude (per layer and per row), Wanda and SparseGPT at 50%
unstructured and 2:4, attention-, MLP- and block (ShortGPT) drops of 8 of 30 layers. Writes
bench/out/prune_smollm2.json (git-ignored) and prints it.
"""

from __future__ import annotations

import argparse
import json

import harness
import torch

from core.settings import Settings
from workers.evaluation.perplexity import perplexity

# name -> (method, sparsity or number of layers for drops, pattern)
PRUNINGS: dict[str, tuple[str, float, str]] = {
    "magnitude-50%": ("magnitude", 0.5, "unstructured"),
    "magnitude-row-50%": ("magnitude-row", 0.5, "unstructured"),
    "wanda-50%": ("wanda", 0.5, "unstructured"),
    "sparsegpt-50%": ("sparsegpt", 0.5, "unstructured"),
    "magnitude-2:4": ("magnitude", 0.5, "2:4"),
    "wanda-2:4": ("wanda", 0.5, "2:4"),
    "sparsegpt-2:4": ("sparsegpt", 0.5, "2:4"),
    "attention-drop-8": ("attention-drop", 8, "unstructured"),
    "mlp-drop-8": ("mlp-drop", 8, "unstructured"),
    "shortgpt-8": ("shortgpt", 8, "unstructured"),
}


def parse_args() -> tuple[argparse.Namespace, Settings]:
    made = harness.parser(__doc__, "prune_smollm2")
    harness.add_model_args(made)
    harness.add_store_args(made)
    harness.add_calibration_args(made, sequences=32, length=512)
    made.add_argument("--methods", nargs="*", default=None, help="only the prunings whose name starts so")
    made.add_argument("--seqlen", type=int, default=512)
    made.add_argument("--windows", type=int, default=4)
    made.add_argument("--seed", type=int, default=42, help="the calibration's seed")
    return harness.parse_engine(made)


def main() -> None:
    args, settings = parse_args()
    dense = harness.load_dense(args.model, settings)
    layers = int(dense.model.config.num_hidden_layers)
    token_ids = harness.wikitext_ids(dense, settings)
    calibration = harness.calibration_for(dense, settings, args, args.seed)

    def ppl(model: torch.nn.Module) -> float:
        return perplexity(model, token_ids, seqlen=args.seqlen, max_windows=args.windows, batch_size=1).ppl

    result = harness.start_report(
        model=args.model,
        protocol={"dataset": "wikitext2", "seqlen": args.seqlen, "windows": args.windows},
        calibration={
            "corpus": args.calibration_corpus,
            "sequences": args.calibration_sequences,
            "length": args.calibration_length,
            "seed": calibration.record["seed"],
        },
        dense_ppl=ppl(dense.model),
        threads=args.threads,
        prunings={},
    )
    for name, (method, amount, pattern) in PRUNINGS.items():
        if args.methods and not any(name.startswith(prefix) for prefix in args.methods):
            continue
        sparsity = amount / layers if amount >= 1 else amount
        pruned, report, pruning_s = harness.prune_copy(dense, method, sparsity, calibration, pattern)
        result["prunings"][name] = {
            "method": method,
            "pattern": pattern,
            "sparsity": sparsity,
            "ppl": ppl(pruned.model),
            "param_fraction_removed": report.param_fraction_removed,
            "achieved_sparsity": report.achieved_sparsity,
            "dropped_layers": report.dropped_layers,
            "pruning_s": pruning_s,
        }
        print(name, json.dumps(result["prunings"][name]), flush=True)
        del pruned
    harness.finish_report(args.out, result)
    print(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
