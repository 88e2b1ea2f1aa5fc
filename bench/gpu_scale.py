"""The scale step of the GPU check: a model of Llama-3-8B's shape, seeded random bf16 weights built on
the device (no weights travel), timing SliceGPT, its simulation, Wanda and a perplexity pass, each
resident and again under a device-memory cap that forces the model to stay on the CPU and stream
block by block. Writes JSON after every step, so a timeout loses nothing.

Usage (the lent device machine runs it from `bench/gpu_check.sh`; the dry run is this CPU's):

    python bench/gpu_scale.py --out $OUT/gpu_scale.json
    python bench/gpu_scale.py --dry-run --out /tmp/gpu_scale.json     # a small shape, on the CPU

Per step: wall seconds, the device's peak allocated bytes (reset between steps; null on the CPU), and
the achieved throughput as forward-equivalent FLOPs per second, 2 x (non-embedding parameters) x
(tokens the step runs through the blocks: calibration windows for slicing and Wanda, calibration
plus evaluation windows per sparsity for the simulation, evaluation windows for perplexity), over
the card's dense bf16 peak (`PEAK_BF16_TFLOPS`; null for a card not listed). It counts no attention
score FLOPs and no PCA, so it is a floor of the work done. Untrained weights make the perplexities
meaningless; the timings and memory are what this step measures.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable
from typing import Any

import harness
import torch
import transformers

from workers.architectures import match_structure
from workers.evaluation.perplexity import perplexity
from workers.offload import offload, suspended
from workers.pruning import prune_model
from workers.simulation.curve import simulate_curve
from workers.slicing.engine import slice_model

LLAMA3_8B = {"hidden": 4096, "intermediate": 14336, "layers": 32, "heads": 32, "kv_heads": 8, "vocab": 128256}
DRY_RUN = {"hidden": 256, "intermediate": 512, "layers": 2, "heads": 4, "kv_heads": 2, "vocab": 1024}
CONFIG_FIELDS = {
    "hidden": "hidden_size",
    "intermediate": "intermediate_size",
    "layers": "num_hidden_layers",
    "heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "vocab": "vocab_size",
}
"""The shape's names -> LlamaConfig's."""
PEAK_BF16_TFLOPS = {"H100 80GB HBM3": 989.0, "H100 SXM": 989.0, "H100 PCIe": 756.0, "H200": 989.0}
"""Dense bf16 tensor-core peaks (no sparsity) by a substring of torch.cuda.get_device_name."""


def parse_args() -> argparse.Namespace:
    made = harness.parser(__doc__, "gpu_scale", threads=None)
    made.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    made.add_argument("--dry-run", action="store_true", help="the small shape, for this CPU")
    for name, value in LLAMA3_8B.items():
        made.add_argument(f"--{name.replace('_', '-')}", type=int, default=None, help=f"default {value}")
    made.add_argument("--calibration", type=int, default=8, help="calibration windows")
    made.add_argument("--seqlen", type=int, default=512)
    made.add_argument("--windows", type=int, default=4, help="evaluation windows")
    made.add_argument("--cap-gib", type=float, default=8.0, help="device memory cap of the offloaded runs")
    made.add_argument("--deadline-s", type=float, default=300.0, help="skip the steps left after this")
    return made.parse_args()


def shape(args: argparse.Namespace) -> dict[str, int]:
    base = DRY_RUN if args.dry_run else LLAMA3_8B
    return {name: getattr(args, name) or value for name, value in base.items()}


def build(dims: dict[str, int], device: torch.device, dtype: torch.dtype) -> Any:
    """Llama of the given shape with seeded random weights, made directly on `device` in `dtype`."""
    sized = {CONFIG_FIELDS[name]: value for name, value in dims.items()}
    config = transformers.LlamaConfig(
        **sized, max_position_embeddings=8192, rope_theta=500000.0, tie_word_embeddings=False
    )
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = transformers.LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def block_parameters(model: Any) -> int:
    return sum(p.numel() for block in match_structure(model).blocks(model) for p in block.parameters())


def peak_tflops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16_TFLOPS.items() if key in name), None)


class Steps:
    """Runs each step timed, with its peak memory and throughput, and writes the report after it."""

    def __init__(self, args: argparse.Namespace, device: torch.device, report: dict[str, Any]) -> None:
        self.args, self.device, self.report = args, device, report
        self.started = time.perf_counter()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def run(self, name: str, tokens: int, params: int, action: Callable[[], Any]) -> Any:
        entry: dict[str, Any] = self.report["steps"].setdefault(name, {})
        if time.perf_counter() - self.started > self.args.deadline_s:
            entry["skipped"] = f"past the {self.args.deadline_s:g} s deadline"
            harness.write_report(self.args.out, self.report)
            return None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
        self.sync()
        began = time.perf_counter()
        value = action()
        self.sync()
        wall = time.perf_counter() - began
        flops = 2.0 * params * tokens
        peak = peak_tflops(self.device)
        entry.update(
            wall_s=round(wall, 3),
            tokens=tokens,
            achieved_tflops=round(flops / wall / 1e12, 3),
            share_of_bf16_peak=None if peak is None else round(flops / wall / 1e12 / peak, 4),
            peak_device_bytes=torch.cuda.max_memory_allocated(self.device)
            if self.device.type == "cuda"
            else None,
        )
        if isinstance(value, float):
            entry["ppl"] = value
        elif hasattr(value, "points"):  # a simulation: its face values
            entry["simulated_ppl"] = [point.scores.ppl for point in value.points]
        print(name, entry, flush=True)
        harness.write_report(self.args.out, self.report)
        return value


def configuration(steps: Steps, label: str, model: Any, offloaded: bool, ids: torch.Tensor) -> None:
    """Slicing, the simulation of slicing and of Wanda, Wanda and perplexity, on copies of `model`."""
    args, device = steps.args, steps.device
    calibration, evaluation = ids[: args.calibration], ids[args.calibration :]
    params = block_parameters(model)
    cal_tokens, eval_tokens = calibration.numel(), evaluation.numel()
    home = torch.device("cpu") if offloaded else device
    if offloaded:
        offload(model, match_structure(model).blocks(model), device)
    blocks_of = lambda each: match_structure(each).blocks(each)  # noqa: E731

    def ppl() -> float:
        return perplexity(model, evaluation.reshape(-1), seqlen=args.seqlen, max_windows=args.windows).ppl

    steps.run(f"{label}/perplexity", eval_tokens, params, ppl)
    with suspended(model, blocks_after=blocks_of):  # the engines move blocks themselves
        for method, sparsity in (("slicegpt", 0.25), ("wanda", 0.5)):
            steps.run(
                f"{label}/simulate-{method}",
                cal_tokens + eval_tokens,
                params,
                lambda method=method, sparsity=sparsity: simulate_curve(
                    model,
                    method,
                    evaluation.to(home),
                    [sparsity],
                    calibration_ids=calibration.to(home),
                    device=device,
                ),
            )
        steps.run(
            f"{label}/wanda",
            cal_tokens,
            params,
            lambda: prune_model(model, "wanda", 0.5, calibration_ids=calibration.to(home), device=device),
        )
        steps.run(
            f"{label}/slicing",
            cal_tokens,
            params,
            lambda: slice_model(model, calibration.to(home), None, 0.25, device=device, keep_bases=False),
        )
    steps.run(f"{label}/perplexity-pruned", eval_tokens, block_parameters(model), ppl)


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    dims = shape(args)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    report = harness.start_report(shape=dims, device=str(device), dtype=str(dtype), steps={})
    if device.type == "cuda":
        report["device_name"] = torch.cuda.get_device_name(device)
        report["device_total_bytes"] = torch.cuda.get_device_properties(device).total_memory
    generator = torch.Generator().manual_seed(1)
    count = args.calibration + args.windows
    ids = torch.randint(0, dims["vocab"], (count, args.seqlen), generator=generator)  # (N + W, T)
    steps = Steps(args, device, report)
    model = steps.run("build", 0, 0, lambda: build(dims, device, dtype))
    report["block_parameters"] = block_parameters(model)
    configuration(steps, "resident", model, offloaded=False, ids=ids.to(device))
    del model
    model = build(dims, device, dtype).to("cpu")  # the same seeded weights, home on the CPU
    if device.type == "cuda":
        torch.cuda.empty_cache()
        fraction = min(1.0, args.cap_gib * 2**30 / report["device_total_bytes"])
        torch.cuda.set_per_process_memory_fraction(fraction, device)
        report["cap_bytes"] = int(fraction * report["device_total_bytes"])
    configuration(steps, "offloaded", model, offloaded=True, ids=ids)
    harness.finish_report(args.out, report)


if __name__ == "__main__":
    main()
