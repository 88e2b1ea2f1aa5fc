"""Time SliceGPT on the packaged SmolLM2-135M and measure its peak memory against the model's size.

Usage (from the repository root):

    HF_HUB_OFFLINE=1 .venv/bin/python bench/slice_smollm2.py            # issue 3: 128 x 512, s = 0.25
    HF_HUB_OFFLINE=1 .venv/bin/python bench/slice_smollm2.py --help

Stages, in this order so that the process-lifetime peak (ru_maxrss) read after slicing covers
only load, calibration prep and slicing (evaluation logits are large and come later):

1. load: the converted fp32 model from the cache (the GGUF is converted on first use, ~25 s);
2. calibration: tokenise the BoolQ Wikipedia passages, cut N windows of T tokens at seeded offsets;
3. slicing: `workers.slicing.engine.slice_model`, in place;
4. eval_sliced: WikiText-2 test token PPL of the sliced model (seqlen 2048, first 4 windows);
5. eval_dense: reload the dense model, same PPL protocol.

A sampling thread reads the process RSS every 10 ms and keeps the peak per stage; ru_maxrss
snapshots after each stage give the kernel's own lifetime peak. Wall and CPU seconds are both
recorded: on shared machines wall time is noisy, CPU time less so. The JSON goes to
bench/out/slice_smollm2.json (git-ignored) and to stdout.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import harness
import psutil
import torch

from core.model_sources import resolve_model
from workers.architectures import detect_family
from workers.data import load_calibration_text, load_wikitext2_test, tokenize_corpus
from workers.evaluation.perplexity import effective_seqlen, perplexity
from workers.loading import load_model
from workers.slicing.engine import count_parameters, slice_model

MIB = 1024 * 1024


class RssSampler:
    """Samples this process's memory in a daemon thread; keeps per-stage peaks of the RSS and of its
    anonymous part (RSS minus file-backed and shared pages: what the process really allocated)."""

    def __init__(self, interval_s: float = 0.01) -> None:
        self.process = psutil.Process()
        self.interval_s = interval_s
        self.stage = "start"
        self.peaks: dict[str, int] = {}
        self.anon_peaks: dict[str, int] = {}
        self.samples = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def memory(self) -> tuple[int, int]:
        """(RSS, anonymous RSS) in bytes."""
        info = self.process.memory_info()
        return int(info.rss), int(info.rss - info.shared)

    def rss(self) -> int:
        return self.memory()[0]

    def enter(self, stage: str) -> None:
        self.sample()
        with self._lock:
            self.stage = stage
        self.sample()

    def sample(self) -> None:
        rss, anon = self.memory()
        with self._lock:
            self.samples += 1
            self.peaks[self.stage] = max(self.peaks.get(self.stage, 0), rss)
            self.anon_peaks[self.stage] = max(self.anon_peaks.get(self.stage, 0), anon)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            time.sleep(self.interval_s)


def parameter_bytes(module: torch.nn.Module) -> int:
    return sum(parameter.numel() * parameter.element_size() for parameter in module.parameters())


def parse_args() -> argparse.Namespace:
    parser = harness.slicing_parser(__doc__, "slice_smollm2")
    parser.add_argument("--batch-size", type=int, default=8, help="calibration batch size of the engine")
    parser.add_argument("--round-to", type=int, default=8)
    parser.add_argument("--no-eval", action="store_true", help="skip both perplexity evaluations")
    parser.add_argument(
        "--device", default="cpu", help="compute device for slicing and evaluation (the model stays on CPU)"
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    harness.use_threads(args.threads)
    device = torch.device(args.device)
    sampler = RssSampler()
    sampler.start()
    stages: dict[str, dict[str, float]] = {}
    ru_after: dict[str, int] = {}

    @contextmanager
    def stage(name: str) -> Iterator[None]:
        gc.collect()
        sampler.enter(name)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        wall, cpu = time.perf_counter(), harness.cpu_seconds()
        yield
        record = {"wall_s": time.perf_counter() - wall, "cpu_s": harness.cpu_seconds() - cpu}
        if device.type == "cuda":
            record["cuda_peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        stages[name] = record
        sampler.sample()
        ru_after[name] = harness.peak_rss_bytes()
        sampler.enter("between")

    load_average_start = os.getloadavg()
    rss_start = sampler.rss()
    settings = harness.settings_for(args)
    source = resolve_model(args.model, settings)
    total_wall = time.perf_counter()

    with stage("load"):
        loaded = load_model(source, settings, dtype="float32", device="cpu")
    model = loaded.model
    gc.collect()
    rss_after_load = sampler.rss()  # weights may still be lazily mapped from the safetensors file
    with stage("touch"):  # read every weight once so the baseline holds the whole model
        for parameter in model.parameters():
            parameter.detach().sum()
    rss_after_touch = sampler.rss()
    adapter = detect_family(model)
    blocks = adapter.blocks(model)
    hidden = int(model.config.hidden_size)
    tied = bool(model.config.tie_word_embeddings)
    untied_head_params = int(model.config.vocab_size) * hidden if tied else 0  # what slicing's untie adds
    model_info = {
        "id": loaded.model_id,
        "revision": loaded.revision,
        "architecture": type(model).__name__,
        "hidden_size": hidden,
        "num_blocks": len(blocks),
        "params": count_parameters(model),
        "param_bytes_fp32": parameter_bytes(model),
        "buffer_bytes": sum(buffer.numel() * buffer.element_size() for buffer in model.buffers()),
        "one_block_param_bytes": parameter_bytes(blocks[0]),
        "tied_embeddings": tied,
        "untied_head_params": untied_head_params,
        "untied_head_extra_bytes": untied_head_params * 4,
    }

    with stage("calibration"):
        corpus = load_calibration_text(args.calibration_corpus, settings)
        tokens = tokenize_corpus(loaded.tokenizer, corpus, settings=settings)
        calibration_ids = harness.sample_calibration(
            tokens, args.calibration_sequences, args.calibration_length, args.seed
        )
    gc.collect()
    rss_before_slicing, anon_before_slicing = sampler.memory()

    def on_progress(done: int, total: int) -> None:
        if done == 0:
            sampler.enter("slicing/blocks")
        elif done == total:
            sampler.enter("slicing/head")

    with stage("slicing"):
        sampler.enter("slicing/capture+embeddings")
        report = slice_model(
            model,
            calibration_ids,
            None,
            args.sparsity,
            round_to=args.round_to,
            batch_size=args.batch_size,
            device=device if device.type != "cpu" else None,
            progress=on_progress,
        )
    peak_ru_through_slicing = ru_after["slicing"]
    slicing_peaks = {name: peak for name, peak in sampler.peaks.items() if name.startswith("slicing")}
    peak_sampled_slicing = max(slicing_peaks.values())
    peak_anon_slicing = max(peak for name, peak in sampler.anon_peaks.items() if name.startswith("slicing"))

    dtype_bytes = torch.finfo(model.dtype).bits // 8 if model.dtype.is_floating_point else 4
    positions = args.calibration_sequences * args.calibration_length
    activations = {
        "shape": [args.calibration_sequences, args.calibration_length, hidden],
        "bytes_fp32_full_width": positions * hidden * 4,
        "engine_dtype": report.dtype,
        "bytes_engine_dtype_full_width": positions * hidden * dtype_bytes,
        "bytes_engine_dtype_sliced_width": positions * report.width * dtype_bytes,
        "note": (
            "the engine keeps every calibration batch's residual stream on the model's device in the "
            "model's dtype; inside a block it holds them at the full width D (original basis) until the "
            "next PCA, so the full-width figure is the one to compare with"
        ),
    }
    activation_bytes = activations["bytes_engine_dtype_full_width"]

    evaluation: dict[str, Any] | None = None
    if not args.no_eval:
        wikitext = load_wikitext2_test(settings)
        eval_ids = tokenize_corpus(loaded.tokenizer, wikitext, settings=settings)
        seqlen = effective_seqlen(model, args.eval_seqlen)
        with stage("eval_sliced"):
            model.to(device)
            sliced = perplexity(model, eval_ids, seqlen=seqlen, max_windows=args.eval_windows)
        del model, loaded
        gc.collect()
        with stage("eval_dense"):
            dense_model = load_model(source, settings, dtype="float32", device="cpu").model
            dense_model.to(device)
            dense = perplexity(dense_model, eval_ids, seqlen=seqlen, max_windows=args.eval_windows)
        del dense_model
        evaluation = {
            "protocol": {
                "dataset": "wikitext-2-raw test (rows joined with \\n\\n, tokenised once)",
                "dataset_sha256": wikitext.sha256,
                "metric": "token perplexity, non-overlapping windows, no carried context",
                "seqlen": seqlen,
                "windows": sliced.windows,
                "which_windows": f"first {sliced.windows}",
                "tokens_scored": sliced.tokens_scored,
            },
            "dense_ppl": dense.ppl,
            "sliced_ppl": sliced.ppl,
            "ratio": sliced.ppl / dense.ppl,
            "strict_law_ppl": dense.ppl ** (1 / (1 - args.sparsity)),
        }

    sampler.stop()
    total_wall = time.perf_counter() - total_wall
    blocks_s = report.timings["blocks"]
    peak = max(peak_ru_through_slicing, peak_sampled_slicing)
    result: dict[str, Any] = {
        "bench": "slice_smollm2",
        "note": (
            "wall times measured on a machine whose cores are shared with other work: treat them as "
            "noisy (see load_average and cpu_s)"
        ),
        "model": model_info,
        "slicing": {
            "method": "slicegpt",
            "sparsity": args.sparsity,
            "round_to": args.round_to,
            "width_d": report.width,
            "slice_head": report.slice_head,
            "family": report.family,
            "widths_per_signal": report.widths.to_dict(),
            "params_before": report.params_before,
            "params_after": report.params_after,
            "predicted_params_after": report.predicted_params_after,
            "param_fraction_removed": report.param_fraction_removed,
            # slicing unties the head (+V x D); against an untied dense model the saving is larger
            "param_fraction_removed_vs_untied_dense": 1
            - report.params_after / (report.params_before + model_info["untied_head_params"]),
            "engine_timings_s": {
                "capture": report.timings["capture"],
                "head": report.timings["head"],
                "total": report.timings["total"],
                "block_mean": sum(blocks_s) / len(blocks_s),
                "block_min": min(blocks_s),
                "block_max": max(blocks_s),
                "blocks": blocks_s,
            },
            "compute_device": report.device,
            "batch_size": args.batch_size,
        },
        "calibration": {
            "corpus": args.calibration_corpus,
            "corpus_sha256": corpus.sha256,
            "corpus_tokens": int(tokens.numel()),
            "sequences": args.calibration_sequences,
            "length": args.calibration_length,
            "sampling": "seeded uniform random offsets into the tokenised corpus (torch.Generator)",
            "seed": args.seed,
            "calibration_ids_bytes": calibration_ids.numel() * calibration_ids.element_size(),
        },
        "activations": activations,
        "timing": {"total_wall_s": total_wall, "stages": stages},
        "memory": {
            "rss_start_bytes": rss_start,
            "rss_after_load_bytes": rss_after_load,
            "rss_after_touch_bytes": rss_after_touch,
            "rss_before_slicing_bytes": rss_before_slicing,
            "anon_rss_before_slicing_bytes": anon_before_slicing,
            "peak_rss_sampled_per_stage_bytes": sampler.peaks,
            "peak_anon_rss_sampled_per_stage_bytes": sampler.anon_peaks,
            "ru_maxrss_after_stage_bytes": ru_after,
            "peak_rss_through_slicing_bytes": peak,
            "peak_slicing_substage": max(slicing_peaks, key=lambda name: slicing_peaks[name]),
            "peak_rss_over_model_size": peak / model_info["param_bytes_fp32"],
            "slicing_growth_bytes": peak - rss_before_slicing,
            "slicing_growth_over_activation_bytes": (peak - rss_before_slicing) / activation_bytes,
            "peak_anon_rss_through_slicing_bytes": peak_anon_slicing,
            "slicing_anon_growth_bytes": peak_anon_slicing - anon_before_slicing,
            "slicing_anon_growth_over_activation_bytes": (peak_anon_slicing - anon_before_slicing)
            / activation_bytes,
            "sliced_model_param_bytes": report.params_after * dtype_bytes,
            "sampler_interval_s": sampler.interval_s,
            "sampler_samples": sampler.samples,
            "definitions": (
                "RSS includes the model's safetensors pages, which stay mapped (clean, file-backed) "
                "until the last original weight is replaced; anon RSS = RSS - file-backed/shared pages "
                "(psutil rss - shared). Baseline: after load, a read of every weight, and calibration "
                "prep, gc.collect()ed. Peak: max(ru_maxrss read right after slicing, sampled peak); "
                "slicing sub-stages come from the engine's progress callback (capture+embeddings until "
                "block 0 starts, blocks, head = final-norm fold and head rotation)"
            ),
        },
        "evaluation": evaluation,
        "environment": {**harness.machine_facts(), "load_average_start": load_average_start},
    }
    harness.finish_report(args.out, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
