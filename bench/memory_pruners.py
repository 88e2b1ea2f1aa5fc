"""Peak memory of the calibrated engines on SmolLM2-135M, one fresh process per run, side by side.

Usage (from the repository root):

    HF_HUB_OFFLINE=1 .venv/bin/python bench/memory_pruners.py
    HF_HUB_OFFLINE=1 .venv/bin/python bench/memory_pruners.py --before /work/before  # a checkout to compare

Each run is a child process that loads the fp32 model and the calibration windows (BoolQ passages,
seeded) and reads every weight once (so a memory-mapped checkpoint is resident), then resets the
kernel's peak-RSS mark (`/proc/self/clear_refs`, 5) and runs one engine;
its extra peak is VmHWM minus the RSS just before the engine started, so loading never counts.
With `--before`, every engine also runs from that checkout (e.g. a `git worktree` of the previous
commit), alternating with this one, so the two see the same machine. The prediction printed
beside each is the engine's docstring formula for the captured stream and its statistics: live
tensors. glibc's allocator keeps some freed buffers in its heap, so with its defaults the measured
peak sits above the tensors and varies run to run. `--child-env MALLOC_MMAP_THRESHOLD_=1048576`
makes it return every freed buffer of 1 MiB or more at once, and the peak is then the tensors'.
Writes bench/out/memory_pruners.json (git-ignored) and prints it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import harness

CHILD = r"""
import gc, json, os, resource, sys, time
import torch
from core.model_sources import resolve_model
from core.settings import Settings
from workers.calibration import build_calibration, calibration_corpus
from workers.loading import load_model

engine, sequences, length, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
settings = Settings()
dense = load_model(resolve_model("smollm2-135m", settings), settings, dtype="float32", device="cpu")
calibration = build_calibration(
    dense.tokenizer, calibration_corpus("boolq-passages", None, settings),
    num_sequences=sequences, seqlen=length, seed=42, settings=settings,
)
ids, mask = calibration.input_ids, calibration.attention_mask

def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    raise RuntimeError(field)

# Touch every weight so that a memory-mapped checkpoint is resident before the baseline is read
# (otherwise the engine's first reads of the weights would count as its own memory).
checksum = sum(float(p.detach().abs().sum()) for p in dense.model.parameters())
gc.collect()
before = rss("VmRSS:")
with open("/proc/self/clear_refs", "w") as handle:
    handle.write("5")
started = time.perf_counter()
if engine == "slicing":
    from workers.slicing.engine import slice_model
    slice_model(dense.model, ids, mask, 0.25, keep_bases=False)
else:
    from workers.pruning import prune_model
    prune_model(dense.model, engine, 0.5, calibration_ids=ids, attention_mask=mask)
wall = time.perf_counter() - started
peak = rss("VmHWM:")
model_bytes = sum(p.numel() * p.element_size() for p in dense.model.parameters())
print(json.dumps({"rss_before": before, "peak": peak, "extra_peak": peak - before, "wall_s": wall,
                  "model_bytes": model_bytes}))
"""


def predicted_extra(
    engine: str, sequences: int, length: int, config: dict[str, int]
) -> dict[str, int] | None:
    """The docstring formulas (workers/pruning/sequential.py, wanda.py, sparsegpt.py), in bytes; None
    for slicing, whose engine states none yet."""
    if engine == "slicing":
        return None
    hidden, mlp, batch = config["hidden_size"], config["intermediate_size"], 8
    stream = sequences * length * hidden * 4  # the captured hidden states, fp32
    # one batch through a block: input, output, q/k/v/attention output (~6 D) and gate/up/product (3 F)
    one_batch = batch * length * (6 * hidden + 3 * mlp) * 4
    chunk = (1 << 20) * 8  # one float64 row chunk
    parts = {"stream": stream, "one_batch_activations": one_batch, "row_chunk": chunk}
    if engine == "sparsegpt":
        parts["hessians"] = 4 * (3 * hidden**2 + mlp**2)  # q/k/v shared, gate/up shared
        parts["solve"] = 4 * (3 * mlp**2 + hidden * mlp)  # down_proj: damped H, inverse, factor, work
    elif engine == "wanda":
        parts["sums"] = 8 * (3 * hidden + mlp)
    parts["total"] = sum(parts.values())
    return parts


def run_child(repo: Path, engine: str, args: argparse.Namespace) -> dict[str, Any]:
    env = harness.child_env(args, repo) | dict(item.split("=", 1) for item in args.child_env)
    command = [sys.executable, "-c", CHILD, engine, str(args.sequences), str(args.length), str(args.threads)]
    return harness.child_json(command, repo, env, timeout_s=3600, label=engine)


def main() -> None:
    made = harness.parser(__doc__, "memory_pruners", threads=1)
    harness.add_store_args(made)
    made.add_argument("--before", type=Path, default=None, help="a checkout of the code to compare against")
    made.add_argument("--engines", nargs="*", default=["wanda", "sparsegpt", "slicing"])
    made.add_argument("--sequences", type=int, default=128)
    made.add_argument("--length", type=int, default=512)
    made.add_argument(
        "--child-env",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="environment of every run, e.g. MALLOC_MMAP_THRESHOLD_=1048576 (glibc returns each freed "
        "buffer of 1 MiB or more at once, so the peak is the live tensors')",
    )
    args = made.parse_args()
    config = {"hidden_size": 576, "intermediate_size": 1536}  # SmolLM2-135M
    checkouts = {"after": harness.REPO_ROOT} | ({"before": args.before.resolve()} if args.before else {})
    harness.use_threads(args.threads)  # the children's count, recorded in the environment
    result = harness.start_report(
        model="smollm2-135m",
        calibration={"sequences": args.sequences, "length": args.length, "batch_size": 8},
        threads=args.threads,
        child_env=args.child_env,
        runs={},
    )
    for engine in args.engines:
        entry: dict[str, Any] = {
            "predicted_extra": predicted_extra(engine, args.sequences, args.length, config)
        }
        for label, repo in checkouts.items():
            entry[label] = run_child(repo, engine, args)
            print(engine, label, json.dumps(entry[label]), flush=True)
        result["runs"][engine] = entry
    harness.finish_report(args.out, result)
    print(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
