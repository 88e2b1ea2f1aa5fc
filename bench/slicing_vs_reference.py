"""SliceGPT on SmolLM2-135M: prunecast's engine against the SliceGPT authors' code, side by side.

Usage (from the repository root; the reference in its own virtualenv, see bench/README.md):

    HF_HUB_OFFLINE=1 .venv/bin/python bench/slicing_vs_reference.py \
        --reference-python /work/tcvenv/bin/python --repeats 2

Both sides slice the same fp32 model at s = 0.25 (d = 432 of 576, head not sliced) on the same
128 x 512 BoolQ passage windows (seed 42, tokenised here once and handed to both as token ids),
each in a fresh child process with 2 torch threads, alternating prunecast and the reference so
both see the same machine. Each child loads the model, reads every weight once, measures the
dense perplexity, hands the heap's free pages back (malloc_trim), then resets the kernel's
peak-RSS mark and slices; the tied head is untied inside the measured part on both sides
(the reference's Llama adapter assumes an untied head). `--before PATH` adds a third side after
each pair: prunecast from another checkout (e.g. `git worktree add PATH HEAD~1`), same harness.
Reported per run:

- `wall_s`: slicing only (untie, norm fusion, capture, every block, head);
- `runtime_rss`: RSS after the imports, before the model is loaded (the interpreter, torch,
  transformers: the same for every job, so not the engine's);
- `peak_rss`: VmHWM through slicing; `job_peak` = peak_rss - runtime_rss, what loading and
  slicing added; `goal_ratio` = job_peak / (model bytes + one block's calibration activations,
  N x T x D fp32), the issue's measure (goal <= 1.3);
- `ppl`: WikiText-2 test perplexity of the sliced model (seqlen 2048, first 4 windows, the same
  token ids on both sides) and of the dense model.

The reference's `fuse_modules` subtracts the embeddings' mean even on RMSNorm models, which changes
their function (the dense fused model's PPL is reported beside it), so its sliced perplexity is
not expected to match; time and memory are the comparison. Writes
bench/out/slicing_vs_reference.json (git-ignored) and prints it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import harness

MIB = 1024 * 1024

COMMON = r"""
import ctypes, gc, json, sys, time
import torch

def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    raise RuntimeError(field)

def reset_peak():
    # what the dense evaluation left in the heap goes back first, on both sides alike
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")

@torch.no_grad()
def perplexity(model, windows):
    nll, count = 0.0, 0
    for row in windows:
        logits = model(input_ids=row[None]).logits[0, :-1].float()
        nll += float(torch.nn.functional.cross_entropy(logits, row[1:], reduction="sum"))
        count += row.numel() - 1
    return float(torch.exp(torch.tensor(nll / count)))

inputs = torch.load(sys.argv[1])
folder, threads, sparsity, batch = sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(threads)
"""

OURS = r"""
from core.model_sources import resolve_model
from core.settings import Settings
from workers.loading import load_model
from workers.slicing.engine import slice_model

runtime = rss("VmRSS:")
settings = Settings()
loaded = load_model(resolve_model("smollm2-135m", settings), settings, dtype="float32", device="cpu")
model = loaded.model
model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
checksum = sum(float(p.detach().abs().sum()) for p in model.parameters())
dense_ppl = perplexity(model, inputs["eval_windows"])
reset_peak()
loaded_rss = rss("VmRSS:")
started = time.perf_counter()
report = slice_model(model, inputs["input_ids"], inputs["attention_mask"], sparsity, batch_size=batch,
                     keep_bases=False)
wall = time.perf_counter() - started
peak = rss("VmHWM:")
print(json.dumps({"runtime_rss": runtime, "loaded_rss": loaded_rss, "peak_rss": peak, "wall_s": wall,
                  "model_bytes": model_bytes, "width": report.width,
                  "ppl": perplexity(model, inputs["eval_windows"]), "dense_ppl": dense_ppl,
                  "engine_timings_s": {k: v for k, v in report.timings.items() if k != "blocks"}}))
"""

REFERENCE = r"""
from slicegpt import layernorm_fusion, rotate
from slicegpt.config import config
from slicegpt.model_adapter import ModelAdapter
from slicegpt.slicing_scheduler import ConstSlicingScheduler

config.device, config.dtype = torch.device("cpu"), torch.float32
runtime = rss("VmRSS:")
# hf_utils.get_model_and_tokenizer without the tokenizer (token ids come from prunecast): the
# adapter is chosen by a Llama-2 model name, the weights read from the prepared folder.
adapter = ModelAdapter.from_model("meta-llama/Llama-2-7b-hf", model_path=folder, model_type="pretrained",
                                  dtype=torch.float32, local_files_only=True)
model = adapter.model
model.eval()
adapter.use_cache = False
model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
checksum = sum(float(p.detach().abs().sum()) for p in model.parameters())
dense_ppl = perplexity(model, inputs["eval_windows"])
reset_peak()
loaded_rss = rss("VmRSS:")
ids, mask = inputs["input_ids"], inputs["attention_mask"]
loader = [{"input_ids": ids[i:i + batch], "attention_mask": mask[i:i + batch]}
          for i in range(0, len(ids), batch)]
started = time.perf_counter()
model.lm_head.weight = torch.nn.Parameter(model.model.embed_tokens.weight.detach().clone())  # untie
layernorm_fusion.replace_layers(adapter)
layernorm_fusion.fuse_modules(adapter)
fused_at = time.perf_counter() - started
width = int((1 - sparsity) * adapter.hidden_size)
width -= width % 8
rotate.rotate_and_slice(adapter, loader, ConstSlicingScheduler(width), final_orientation="pca")
wall = time.perf_counter() - started
peak = rss("VmHWM:")
print(json.dumps({"runtime_rss": runtime, "loaded_rss": loaded_rss, "peak_rss": peak, "wall_s": wall,
                  "model_bytes": model_bytes, "width": width, "fuse_s": fused_at,
                  "ppl": perplexity(model, inputs["eval_windows"]), "dense_ppl": dense_ppl}))
"""


def prepare_inputs(args: argparse.Namespace, out_dir: Path) -> tuple[Path, Path, dict[str, Any]]:
    """Tokenise once: calibration windows and evaluation windows as token ids, and a model folder
    the reference's transformers 4.41 can read (RoPE base at top level, no 5.x tokenizer files)."""
    import torch
    from transformers import AutoTokenizer

    from core.model_sources import resolve_model
    from workers.data import load_wikitext2_test, tokenize_corpus
    from workers.loading import ensure_converted

    settings = harness.settings_for(args)
    folder = ensure_converted(resolve_model("smollm2-135m", settings), settings)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    calibration = harness.calibration_batch(tokenizer, settings, args.sequences, args.length, 42)
    eval_ids = tokenize_corpus(tokenizer, load_wikitext2_test(settings), settings=settings)
    windows = eval_ids[: args.eval_windows * args.eval_seqlen].view(args.eval_windows, args.eval_seqlen)
    inputs_path = out_dir / "slicing_vs_reference_inputs.pt"
    torch.save(
        {
            "input_ids": calibration.input_ids,
            "attention_mask": calibration.attention_mask,
            "eval_windows": windows,
        },
        inputs_path,
    )
    reference_folder = Path(tempfile.mkdtemp(prefix="slicegpt-reference-model-"))
    config = json.loads((folder / "config.json").read_text())
    config["rope_theta"] = config.get("rope_parameters", {}).get("rope_theta", config.get("rope_theta"))
    config["torch_dtype"] = "float32"
    (reference_folder / "config.json").write_text(json.dumps(config, indent=1))
    for name in ("model.safetensors", "generation_config.json"):
        (reference_folder / name).symlink_to(folder / name)
    protocol = {
        "model": "smollm2-135m (fp32, converted from the packaged GGUF)",
        "calibration": {
            "corpus": "boolq-passages",
            "sequences": args.sequences,
            "length": args.length,
            "seed": 42,
        },
        "evaluation": {
            "dataset": "wikitext-2-raw test",
            "seqlen": args.eval_seqlen,
            "windows": args.eval_windows,
        },
        "sparsity": args.sparsity,
        "batch_size": args.batch_size,
        "threads": args.threads,
    }
    return inputs_path, reference_folder, protocol


def run_child(
    python: str, code: str, inputs: Path, folder: Path, args: argparse.Namespace, root: Path | None
) -> dict[str, Any]:
    """One measured child; `root` is the prunecast checkout it imports (None: the reference)."""
    env = harness.child_env(args, root)
    command = [
        python, "-c", COMMON + code, str(inputs), str(folder),
        str(args.threads), str(args.sparsity), str(args.batch_size),
    ]  # fmt: skip
    result = harness.child_json(command, root or harness.REPO_ROOT, env, timeout_s=7200, label=python)
    hidden = 576  # SmolLM2-135M's D
    activations = args.sequences * args.length * hidden * 4
    result["job_peak"] = result["peak_rss"] - result["runtime_rss"]
    result["block_activation_bytes"] = activations
    result["goal_ratio"] = result["job_peak"] / (result["model_bytes"] + activations)
    result["peak_over_loaded"] = result["peak_rss"] - result["loaded_rss"]
    return result


def main() -> None:
    made = harness.parser(__doc__, "slicing_vs_reference")
    harness.add_store_args(made)
    harness.add_protocol_args(made, seqlen=2048, windows=4)
    made.add_argument("--reference-python", required=True, help="the python of a virtualenv with slicegpt")
    made.add_argument("--repeats", type=int, default=1)
    made.add_argument("--sequences", type=int, default=128)
    made.add_argument("--length", type=int, default=512)
    made.add_argument("--sparsity", type=float, default=0.25)
    made.add_argument("--batch-size", type=int, default=8)
    made.add_argument("--before", type=Path, help="an earlier commit's checkout (git worktree): a third side")
    args = made.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    harness.use_threads(args.threads)  # the children's count, recorded in the environment
    inputs, reference_folder, protocol = prepare_inputs(args, args.out.parent)
    sides: list[tuple[str, str, str, Path | None]] = [
        ("prunecast", sys.executable, OURS, harness.REPO_ROOT),
        ("reference", args.reference_python, REFERENCE, None),
    ]
    if args.before is not None:
        sides.append(("before", sys.executable, OURS, args.before.resolve()))
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side, *_ in sides}
    result = harness.start_report(protocol=protocol, runs=runs)
    for _ in range(args.repeats):
        for side, python, code, root in sides:
            runs[side].append(run_child(python, code, inputs, reference_folder, args, root))
            print(side, json.dumps(runs[side][-1]), flush=True)
    summary: dict[str, Any] = {}
    for side, entries in runs.items():
        summary[side] = {
            "wall_s_min": min(entry["wall_s"] for entry in entries),
            "job_peak_mib_max": max(entry["job_peak"] for entry in entries) / MIB,
            "goal_ratio_max": max(entry["goal_ratio"] for entry in entries),
            "ppl": entries[-1]["ppl"],
        }
    for side in runs.keys() - {"reference"}:
        pairs = zip(runs[side], runs["reference"], strict=True)
        key = "wall_ratio_per_pair" if side == "prunecast" else f"{side}_wall_ratio_per_pair"
        summary[key] = [ours["wall_s"] / ref["wall_s"] for ours, ref in pairs]
    result["summary"] = summary
    harness.finish_report(args.out, result)
    print(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
