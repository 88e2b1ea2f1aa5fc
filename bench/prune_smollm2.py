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
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

from core.model_sources import resolve_model  # noqa: E402
from core.settings import Settings  # noqa: E402
from workers.calibration import build_calibration, calibration_corpus  # noqa: E402
from workers.data import load_wikitext2_test, tokenize_corpus  # noqa: E402
from workers.environment import run_environment  # noqa: E402
from workers.evaluation.perplexity import perplexity  # noqa: E402
from workers.loading import load_copy, load_model  # noqa: E402
from workers.pruning import prune_model  # noqa: E402

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


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--methods", nargs="*", default=None, help="only the prunings whose name starts so")
    parser.add_argument("--calibration-sequences", type=int, default=32)
    parser.add_argument("--calibration-length", type=int, default=512)
    parser.add_argument("--seqlen", type=int, default=512)
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "out" / "prune_smollm2.json")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    settings = Settings()
    dense = load_model(resolve_model(args.model, settings), settings, dtype="float32", device="cpu")
    layers = int(dense.model.config.num_hidden_layers)
    corpus = load_wikitext2_test(settings)
    token_ids = tokenize_corpus(dense.tokenizer, corpus, settings=settings)
    calibration = build_calibration(
        dense.tokenizer,
        calibration_corpus("boolq-passages", None, settings),
        num_sequences=args.calibration_sequences,
        seqlen=args.calibration_length,
        seed=args.seed,
        settings=settings,
    )

    def ppl(model: torch.nn.Module) -> float:
        return perplexity(model, token_ids, seqlen=args.seqlen, max_windows=args.windows, batch_size=1).ppl

    result: dict[str, Any] = {
        "model": args.model,
        "protocol": {"dataset": "wikitext2", "seqlen": args.seqlen, "windows": args.windows},
        "calibration": {"sequences": args.calibration_sequences, "length": args.calibration_length},
        "dense_ppl": ppl(dense.model),
        "threads": args.threads,
        "load_average_start": os.getloadavg(),
        "environment": {**run_environment(dense.device), "platform": platform.platform()},
        "prunings": {},
    }
    for name, (method, amount, pattern) in PRUNINGS.items():
        if args.methods and not any(name.startswith(prefix) for prefix in args.methods):
            continue
        sparsity = amount / layers if amount >= 1 else amount
        pruned = load_copy(dense)
        started = time.perf_counter()
        report = prune_model(
            pruned.model,
            method,
            sparsity,
            pattern=pattern,
            calibration_ids=calibration.input_ids,
            attention_mask=calibration.attention_mask,
        )
        pruning_s = time.perf_counter() - started
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
    result["load_average_end"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
