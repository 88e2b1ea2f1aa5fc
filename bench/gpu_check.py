"""The GPU check: evaluate, slice, Wanda and a probe on CUDA in fp32 and bf16 (resident and
offloaded), each compared with the same run on the CPU in fp32. Writes JSON.

Usage (on a machine with a GPU; `bench/gpu_check.sh` wraps it for the lent device machine):

    python bench/gpu_check.py --out $OUT/gpu_check.json
    python bench/gpu_check.py --devices cpu --windows 1        # a dry run of the script itself

The model is the packaged SmolLM2-135M where it is installed; otherwise (`--random`, or the device
machine, where its 98 MB package cannot travel) SmolLM2-135M's architecture with seeded random
weights and a byte-level tokenizer, so the comparisons hold while the perplexities themselves are
those of an untrained model. Each configuration runs the same steps on fresh weights:

- perplexity of the dense model (WikiText-2 test when the data is there, else seeded text);
- SliceGPT at s = 0.25 and its perplexity; Wanda 50 % and its perplexity;
- the model-endpoint probe of the Wanda model against the dense one (final KL).

Tolerances (relative, against CPU fp32): fp32 on CUDA 1e-3 (kernel order only); bf16 5e-2 on
perplexity and 2.5e-1 on the probe's KL (bf16 weights and activations; accumulations stay
float32/float64 where the engines say so). Offloaded runs (CPU fp32, CUDA bf16) must equal their
resident twins up to kernel nondeterminism (1e-6); the CPU pair is the dry run's check of the
streaming itself. Each configuration records wall time per step and the device's peak
allocated memory.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import time
from typing import Any

import harness
import torch
import transformers

from workers.architectures import match_structure
from workers.evaluation.perplexity import perplexity
from workers.offload import offload, suspended
from workers.probing.endpoint import model_probe
from workers.pruning import prune_model
from workers.simulation.curve import simulate_curve
from workers.slicing.engine import slice_model

SMOLLM2 = {  # SmolLM2-135M's architecture (config.json of HuggingFaceTB/SmolLM2-135M)
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "max_position_embeddings": 8192,
    "rope_theta": 100000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
    "vocab_size": 49152,
}
SIMULATED = (("slicegpt", 0.25), ("wanda", 0.5))
"""The simulate job's engine at the check's sparsities: its face value is compared like a perplexity."""
TOLERANCE = {"float32": {"ppl": 1e-3, "kl": 1e-3}, "bfloat16": {"ppl": 5e-2, "kl": 2.5e-1}}
CONFIGURATIONS = (  # (name, device, dtype, offloaded)
    ("cpu-fp32", "cpu", torch.float32, False),
    ("cpu-fp32-offloaded", "cpu", torch.float32, True),  # the streaming code path, checkable anywhere
    ("cuda-fp32", "cuda", torch.float32, False),
    ("cuda-bf16", "cuda", torch.bfloat16, False),
    ("cuda-bf16-offloaded", "cuda", torch.bfloat16, True),
)


def build_model(args: argparse.Namespace) -> tuple[Any, Any, str]:
    """(a fresh-weights factory, token ids to score, what the model is)."""
    if not args.random:
        try:
            settings = harness.settings_for(args)
            loaded = harness.load_dense("smollm2-135m", settings)
            folder = loaded.path
            ids = harness.wikitext_ids(loaded, settings)

            def packaged() -> Any:
                return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

            return packaged, ids, "smollm2-135m (packaged weights), WikiText-2 test"
        except Exception as error:  # any missing piece falls back to random weights
            print(f"packaged model unavailable ({error}); using random weights", flush=True)
    config = transformers.LlamaConfig(**SMOLLM2)
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, SMOLLM2["vocab_size"], (args.windows * args.seqlen * 2,), generator=generator)

    def random() -> Any:
        torch.manual_seed(0)  # a copy of the config: slicing edits its model's (untying the head)
        return transformers.AutoModelForCausalLM.from_config(
            copy.deepcopy(config), dtype=torch.float32
        ).eval()

    return random, ids, "SmolLM2-135M architecture, seeded random weights, random token ids"


def calibration_ids(args: argparse.Namespace, ids: torch.Tensor) -> torch.Tensor:
    generator = torch.Generator().manual_seed(42)
    starts = torch.randint(0, ids.numel() - args.seqlen, (args.calibration,), generator=generator)
    return torch.stack([ids[int(start) : int(start) + args.seqlen] for start in starts])  # (N, T)


def run_configuration(
    name: str,
    device: str,
    dtype: torch.dtype,
    offloaded: bool,
    fresh: Any,
    ids: torch.Tensor,
    args: argparse.Namespace,
) -> dict[str, Any]:
    compute = torch.device(device)
    calibration = calibration_ids(args, ids)
    prompts = [row[:64] for row in calibration[:4]]
    if compute.type == "cuda":
        torch.cuda.reset_peak_memory_stats(compute)
    timings: dict[str, float] = {}

    def place(model: Any) -> Any:
        model = model.to(dtype)
        if offloaded:
            offload(model, match_structure(model).blocks(model), compute)
        else:
            model.to(compute)
        return model

    def ppl(model: Any) -> float:
        return perplexity(model, ids, seqlen=args.seqlen, max_windows=args.windows, batch_size=1).ppl

    def timed(step: str, action: Any) -> Any:
        if compute.type == "cuda":
            torch.cuda.synchronize(compute)
        started = time.perf_counter()
        value = action()
        if compute.type == "cuda":
            torch.cuda.synchronize(compute)
        timings[step] = round(time.perf_counter() - started, 3)
        return value

    dense = place(fresh())
    out: dict[str, Any] = {
        "device": device,
        "dtype": str(dtype).removeprefix("torch."),
        "offloaded": offloaded,
    }
    out["dense_ppl"] = timed("dense_ppl_s", lambda: ppl(dense))
    windows = ids[: args.windows * args.seqlen].reshape(args.windows, args.seqlen)  # (W, T)
    out.update(simulate(dense, windows, calibration, compute, timed))

    def pruned(step: str, engine: Any) -> Any:
        """A fresh copy placed like the dense one, pruned by `engine(model)` with the streaming
        suspended (the engines move blocks themselves), then scored."""
        model = place(fresh())
        with suspended(model, blocks_after=lambda each: match_structure(each).blocks(each)):
            timed(f"{step}_s", lambda: engine(model))
        out[f"{step}_ppl"] = timed(f"{step}_ppl_s", lambda: ppl(model))
        return model

    pruned(
        "slicing", lambda model: slice_model(model, calibration, None, 0.25, device=compute, keep_bases=False)
    )
    gc.collect()
    wanda = pruned(
        "wanda", lambda model: prune_model(model, "wanda", 0.5, calibration_ids=calibration, device=compute)
    )
    moved = [prompt.to(compute) for prompt in prompts]
    records = timed("probe_s", lambda: model_probe(dense, wanda, moved, temperature=1.0))
    out["probe_final_kl"] = next(r.value for r in records if r.space == "probs" and r.metric == "kl")
    out["timings"] = timings
    if compute.type == "cuda":
        out["peak_device_bytes"] = torch.cuda.max_memory_allocated(compute)
        out["device_name"] = torch.cuda.get_device_name(compute)
    print(name, json.dumps(out), flush=True)
    return out


def simulate(
    dense: Any, windows: torch.Tensor, calibration: torch.Tensor, compute: torch.device, timed: Any
) -> dict[str, float]:
    """The simulate job's engine on the dense model at each of SIMULATED: its face values."""
    found = {}
    with suspended(dense):  # the simulation streams blocks itself, and leaves the model unchanged
        for method, sparsity in SIMULATED:
            simulated = timed(
                f"simulate_{method}_s",
                lambda method=method, sparsity=sparsity: simulate_curve(
                    dense, method, windows, [sparsity], calibration_ids=calibration, device=compute
                ),
            )
            found[f"simulated_{method}_ppl"] = simulated.points[0].scores.ppl
    return found


def compare(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Relative differences against cpu-fp32 and the verdict per configuration."""
    reference = runs.get("cpu-fp32")
    verdicts: dict[str, Any] = {}
    if reference is None:
        return verdicts
    simulated = (f"simulated_{method}_ppl" for method, _ in SIMULATED)
    keys = ("dense_ppl", "slicing_ppl", "wanda_ppl", "probe_final_kl", *simulated)
    for name, run in runs.items():
        if name.startswith("cpu-"):
            continue  # the reference, and its offloaded twin (compared below)
        limits = TOLERANCE[run["dtype"]]
        differences = {key: abs(run[key] - reference[key]) / abs(reference[key]) for key in keys}
        passed = all(differences[key] <= limits["kl" if key.endswith("kl") else "ppl"] for key in keys)
        verdicts[name] = {"relative_difference": differences, "tolerance": limits, "passed": passed}
    for resident_name, streamed_name in (
        ("cpu-fp32", "cpu-fp32-offloaded"),
        ("cuda-bf16", "cuda-bf16-offloaded"),
    ):
        if resident_name in runs and streamed_name in runs:
            resident, streamed = runs[resident_name], runs[streamed_name]
            gap = max(abs(streamed[key] - resident[key]) / abs(resident[key]) for key in keys)
            verdicts[f"{streamed_name}_vs_resident"] = {"max_relative_difference": gap, "passed": gap <= 1e-6}
    return verdicts


def main() -> None:
    made = harness.parser(__doc__, "gpu_check", threads=torch.get_num_threads())
    harness.add_store_args(made)
    made.add_argument("--devices", nargs="*", default=["cpu", "cuda"])
    made.add_argument(
        "--random", action="store_true", help="random weights even where the packaged model exists"
    )
    made.add_argument("--windows", type=int, default=8)
    made.add_argument("--seqlen", type=int, default=512)
    made.add_argument("--calibration", type=int, default=32)
    args = made.parse_args()
    if "cuda" in args.devices and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here; run with --devices cpu for a dry run")
    harness.use_threads(args.threads)  # default: torch's own count
    fresh, ids, description = build_model(args)
    result = harness.start_report(
        model=description,
        protocol={
            "seqlen": args.seqlen,
            "windows": args.windows,
            "calibration": [args.calibration, args.seqlen],
        },
        runs={},
    )
    for name, device, dtype, offloaded in CONFIGURATIONS:
        if device in args.devices:
            result["runs"][name] = run_configuration(name, device, dtype, offloaded, fresh, ids, args)
    result["verdicts"] = compare(result["runs"])
    harness.finish_report(args.out, result)
    print(json.dumps(result["verdicts"], indent=2))


if __name__ == "__main__":
    main()
