"""What slicing buys at inference time, and what the stock layout costs: SmolLM2-135M dense vs
SliceGPT per-layer vs SliceGPT stock (each pooling of the shared basis), side by side in one run.

Usage (from the repository root):

    HF_HUB_OFFLINE=1 .venv/bin/python bench/stock_layout_smollm2.py                 # s = 0.25, 128 x 512
    HF_HUB_OFFLINE=1 .venv/bin/python bench/stock_layout_smollm2.py --calibration-sequences 32 --quick

One process slices and scores every variant under one protocol (same calibration windows, same
WikiText-2 windows) and saves each model; then, for each saved folder, a fresh subprocess loads it
the way a user would (`from_pretrained` for dense and stock, `load_sliced` for per-layer) and
measures parameters, weight-file bytes, peak RSS (VmHWM: load plus every run below) and tokens/s
of prefill (one forward over `--prefill-tokens`) and of greedy decoding with a KV cache
(`--decode-tokens` new tokens), at batch 1 and 16, median of `--repeats` runs. The inference
subprocesses run one after another, in the order dense, per-layer, stock, twice interleaved,
so load drifts on a shared machine hit every variant alike. JSON to
bench/out/stock_layout_smollm2.json and stdout.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import harness
import torch

from core.model_sources import resolve_model
from core.settings import Settings
from workers.data import load_calibration_text, load_wikitext2_test, tokenize_corpus
from workers.environment import run_environment
from workers.evaluation.perplexity import effective_seqlen, perplexity
from workers.loading import load_model
from workers.slicing.artifacts import load_sliced, save_sliced
from workers.slicing.engine import count_parameters, slice_model
from workers.slicing.stock import DEFAULT_POOLING, Pooling, slice_model_stock


def parse_args() -> argparse.Namespace:
    parser = harness.slicing_parser(__doc__, "stock_layout_smollm2")
    parser.add_argument("--prefill-tokens", type=int, default=256)
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="only the default pooling of the stock layout")
    parser.add_argument("--only", nargs="+", help="slice only these variants (e.g. per-layer-sliced-head)")
    parser.add_argument("--no-inference", action="store_true", help="skip the inference measurements")
    parser.add_argument("--inference", type=Path, help=argparse.SUPPRESS)  # the subprocess mode
    parser.add_argument("--layout", help=argparse.SUPPRESS)
    parser.add_argument("--work-dir", type=Path, default=harness.OUT_DIR / "stock_layout_models")
    return parser.parse_args()


def timed(run: Any, repeats: int) -> float:
    """Median wall seconds of `run()` over `repeats` calls, after one warm-up call."""
    run()
    walls = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        walls.append(time.perf_counter() - started)
    return statistics.median(walls)


@torch.no_grad()
def measure_inference(args: argparse.Namespace) -> dict[str, Any]:
    """The subprocess: load one saved model as a user would, then time prefill and decoding."""
    harness.use_threads(args.threads)
    folder: Path = args.inference
    started = time.perf_counter()
    if args.layout == "per-layer":
        model = load_sliced(folder)
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    load_s = time.perf_counter() - started
    generator = torch.Generator().manual_seed(0)
    vocab = int(model.config.vocab_size)
    result: dict[str, Any] = {
        "params": count_parameters(model),
        "weight_file_bytes": sum(p.stat().st_size for p in folder.glob("*.safetensors")),
        "load_s": load_s,
    }
    for batch in (1, 16):
        prompt = torch.randint(3, vocab, (batch, args.prefill_tokens), generator=generator)
        prefill_s = timed(lambda prompt=prompt: model(prompt, use_cache=False), args.repeats)
        short = prompt[:, :16]
        decode_s = timed(
            lambda short=short: model.generate(
                short,
                max_new_tokens=args.decode_tokens,
                min_new_tokens=args.decode_tokens,
                do_sample=False,
                use_cache=True,
                pad_token_id=0,
            ),
            args.repeats,
        )
        result[f"batch_{batch}"] = {
            "prefill_tokens_per_s": batch * args.prefill_tokens / prefill_s,
            "decode_tokens_per_s": batch * args.decode_tokens / decode_s,
            "decode_s_includes": "the 16-token prompt's prefill, then decode_tokens steps with the KV cache",
        }
    result["peak_rss_bytes"] = peak_rss_bytes()
    return result


def peak_rss_bytes() -> int:
    """VmHWM: the peak RSS of this process image. (Not ru_maxrss: Linux carries it over fork and
    execve, so a child of a large parent would report the parent's peak.)"""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def slice_variants(args: argparse.Namespace, settings: Settings) -> tuple[dict[str, Any], dict[str, Path]]:
    """Every variant sliced from a fresh dense load with the same windows, scored, and saved."""
    source = resolve_model(args.model, settings)
    loaded = load_model(source, settings, dtype="float32", device="cpu")
    corpus = load_calibration_text(args.calibration_corpus, settings)
    tokens = tokenize_corpus(loaded.tokenizer, corpus, settings=settings)
    calibration_ids = harness.sample_calibration(
        tokens, args.calibration_sequences, args.calibration_length, args.seed
    )
    wikitext = load_wikitext2_test(settings)
    eval_ids = tokenize_corpus(loaded.tokenizer, wikitext, settings=settings)
    seqlen = effective_seqlen(loaded.model, args.eval_seqlen)
    record = {"model_id": loaded.model_id, "revision": loaded.revision}
    poolings = [DEFAULT_POOLING] if args.quick else list(Pooling)
    variants: dict[str, Any] = {}
    folders: dict[str, Path] = {}

    def score(name: str, model: Any, slicing_s: float | None, cpu_s: float | None, report: Any) -> None:
        started = time.perf_counter()
        measured = perplexity(model, eval_ids, seqlen=seqlen, max_windows=args.eval_windows)
        variants[name] = {
            "ppl": measured.ppl,
            "tokens_scored": measured.tokens_scored,
            "params": count_parameters(model),
            "slicing_wall_s": slicing_s,
            "slicing_cpu_s": cpu_s,
            "eval_wall_s": time.perf_counter() - started,
            "width": None if report is None else report.width,
            "param_fraction_removed": None if report is None else report.param_fraction_removed,
        }

    score("dense", loaded.model, None, None, None)
    folders["dense"] = args.work_dir / "dense"
    loaded.model.save_pretrained(folders["dense"])
    tokenizer = loaded.tokenizer  # saved into every folder: each is a whole checkpoint
    del loaded
    # per-layer keeps the head's input at D by default; per-layer-sliced-head cuts it to d like the
    # stock layout must, the like-for-like comparison of the two bases
    runs: list[tuple[str, Pooling | None]] = [("per-layer", None), ("per-layer-sliced-head", None)]
    runs += [(f"stock-{pooling.value}", pooling) for pooling in poolings]
    for name, pooling in runs:
        if args.only and name not in args.only:
            continue
        gc.collect()
        model = load_model(source, settings, dtype="float32", device="cpu").model
        wall, cpu = time.perf_counter(), harness.cpu_seconds()
        if pooling is None:
            slice_head = name == "per-layer-sliced-head"
            report = slice_model(model, calibration_ids, None, args.sparsity, slice_head=slice_head)
        else:
            report = slice_model_stock(model, calibration_ids, None, args.sparsity, pooling=pooling)
        score(name, model, time.perf_counter() - wall, harness.cpu_seconds() - cpu, report)
        print(f"{name}: ppl {variants[name]['ppl']:.3f}", file=sys.stderr, flush=True)
        if name in ("per-layer", f"stock-{DEFAULT_POOLING.value}"):  # the two that load-and-run
            folders[name] = args.work_dir / name
            tokenizer.save_pretrained(folders[name])
            save_sliced(
                model,
                report,
                folders[name],
                source_model_id=record["model_id"],
                revision=record["revision"],
                calibration={"sequences": args.calibration_sequences},
            )
        del model
    protocol = {
        **record,
        "sparsity": args.sparsity,
        "calibration": {
            "corpus": args.calibration_corpus,
            "sequences": args.calibration_sequences,
            "length": args.calibration_length,
            "seed": args.seed,
            "corpus_sha256": corpus.sha256,
        },
        "evaluation": {
            "dataset": "wikitext-2-raw test",
            "seqlen": seqlen,
            "windows": f"first {args.eval_windows}",
        },
    }
    return {"protocol": protocol, "variants": variants}, folders


def main() -> None:
    args = parse_args()
    if args.inference is not None:
        print(json.dumps(measure_inference(args)))
        return
    harness.use_threads(args.threads)
    load_average_start = os.getloadavg()
    settings = harness.settings_for(args)
    quality, folders = slice_variants(args, settings)
    inference: dict[str, list[dict[str, Any]]] = {name: [] for name in folders}
    for _round in range(0 if args.no_inference else 2):
        for name, folder in folders.items():
            layout = "per-layer" if name.startswith("per-layer") else "stock"
            command = [
                sys.executable,
                __file__,
                "--inference",
                str(folder),
                "--layout",
                layout,
                "--threads",
                str(args.threads),
                "--repeats",
                str(args.repeats),
                "--prefill-tokens",
                str(args.prefill_tokens),
                "--decode-tokens",
                str(args.decode_tokens),
            ]
            completed = subprocess.run(command, capture_output=True, text=True, check=True, timeout=1800)
            inference[name].append(json.loads(completed.stdout.strip().splitlines()[-1]))
    if args.no_inference:
        inference = {}
    dense = quality["variants"]["dense"]
    ratios = {
        name: {
            "ppl_over_dense": variant["ppl"] / dense["ppl"],
            "params_over_dense": variant["params"] / dense["params"],
        }
        for name, variant in quality["variants"].items()
    }
    speed = {
        name: {
            f"batch_{batch}_{kind}_over_dense": statistics.median(
                run[f"batch_{batch}"][f"{kind}_tokens_per_s"] for run in runs
            )
            / statistics.median(run[f"batch_{batch}"][f"{kind}_tokens_per_s"] for run in inference["dense"])
            for batch in (1, 16)
            for kind in ("prefill", "decode")
        }
        | {
            "peak_rss_over_dense": max(r["peak_rss_bytes"] for r in runs)
            / max(r["peak_rss_bytes"] for r in inference["dense"])
        }
        for name, runs in inference.items()
    }
    result = {
        "bench": "stock_layout_smollm2",
        "quality": quality,
        "quality_ratios": ratios,
        "inference_runs": inference,
        "inference_ratios": speed,
        "environment": {
            **run_environment(torch.device("cpu")),
            "torch_threads": args.threads,
            "load_average_start": load_average_start,
            "commit": harness.commit(),
        },
    }
    harness.finish_report(args.out, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
