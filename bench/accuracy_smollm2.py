"""Multiple-choice accuracy of the packaged SmolLM2-135M against the measured reference values.

For the first `--items` docs of each task (lm-eval's split and prompt format, 0-shot) it reports
acc / acc_norm with stderr and the time per task, next to the reference values measured for the
research (issue 4, ../shared/assets.md); a task passes within +-0.03. It then measures, side by
side in the same run and on the same `--speedup-items` docs of arc_easy:

- one-by-one: one request per forward pass, no padding, no cache (lm-eval with batch size 1);
- batched: requests of all options and docs in padded, length-sorted batches;
- batched + shared context: each doc's context run once, its options on the context's KV cache
  (the default of `workers.evaluation.multiple_choice.score_task`).

Writes bench/out/accuracy_smollm2.json after every step, so a partial run still leaves results.

    .venv/bin/python bench/accuracy_smollm2.py --cache-dir .prunecast/cache

On a shared 2-core CPU one torch thread is faster than two: with other processes running, two
OpenMP threads spin against each other (measured 4.3 s vs 27.6 s for 20 arc_easy docs).
"""

from __future__ import annotations

import time
from typing import Any

import harness
import torch

from core.model_sources import resolve_model
from workers.evaluation.mc_formats import load_task
from workers.evaluation.multiple_choice import TaskResult, score_task
from workers.loading import load_model

# Measured on SmolLM2-135M (this Q4_1 GGUF), 0-shot, first 300 items: (acc, acc_norm).
REFERENCE: dict[str, tuple[float, float | None]] = {
    "arc_easy": (0.503, 0.477),
    "arc_challenge": (0.217, 0.277),
    "piqa": (0.650, 0.667),
    "hellaswag": (0.380, 0.457),
    "winogrande": (0.490, None),
    "boolq": (0.387, 0.477),
    "openbookqa": (0.167, 0.297),
}
TOLERANCE = 0.03
DEFAULT_TASKS = ["arc_easy", "arc_challenge", "piqa", "hellaswag", "winogrande", "boolq", "openbookqa"]
SPEEDUP_MODES = {  # name -> (batch_size, share_context)
    "one_by_one": (1, False),
    "batched": (16, False),
    "batched_shared_context": (16, True),
}


def main() -> None:
    made = harness.parser(__doc__, "accuracy_smollm2", threads=1)
    harness.add_store_args(made)
    made.add_argument("--items", type=int, default=300, help="first N docs of each task")
    made.add_argument("--tasks", nargs="+", default=DEFAULT_TASKS, choices=DEFAULT_TASKS)
    made.add_argument(
        "--speedup-items", type=int, default=50, help="arc_easy docs for the speed-up (0: skip)"
    )
    made.add_argument("--batch-size", type=int, default=16)
    made.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    args, settings = harness.parse_engine(made)
    started = time.perf_counter()
    loaded = load_model(resolve_model("smollm2-135m", settings), settings, device=args.device)
    report = harness.start_report(
        model={"id": loaded.model_id, "revision": loaded.revision, "path": str(loaded.path)},
        load_s=round(time.perf_counter() - started, 2),
        items_per_task=args.items,
        batch_size=args.batch_size,
        tolerance=TOLERANCE,
        speedup=None,
        tasks={},
    )
    report["environment"] |= {"device": str(loaded.device), "dtype": str(loaded.dtype).removeprefix("torch.")}
    harness.write_report(args.out, report)

    if args.speedup_items > 0:
        report["speedup"] = measure_speedup(loaded.model, loaded.tokenizer, args.speedup_items)
        harness.write_report(args.out, report)

    for name in args.tasks:
        cpu_started = harness.cpu_seconds()
        result = score_task(
            loaded.model, loaded.tokenizer, name, limit=args.items, batch_size=args.batch_size
        )
        report["tasks"][name] = task_entry(result)
        report["tasks"][name]["cpu_s"] = round(harness.cpu_seconds() - cpu_started, 1)
        harness.write_report(args.out, report)
        print(format_row(name, report["tasks"][name]), flush=True)

    report["total_task_s"] = round(sum(entry["elapsed_s"] for entry in report["tasks"].values()), 1)
    harness.finish_report(args.out, report)


def measure_speedup(model: torch.nn.Module, tokenizer: Any, items: int) -> dict[str, Any]:
    """The same arc_easy docs scored three ways, back to back; times and agreement."""
    score_task(model, tokenizer, "arc_easy", limit=2)  # warm-up: first-call allocations and kernels
    results: dict[str, TaskResult] = {}
    cpu_s: dict[str, float] = {}
    for mode, (batch_size, share_context) in SPEEDUP_MODES.items():
        cpu_started = harness.cpu_seconds()
        results[mode] = score_task(
            model, tokenizer, "arc_easy", limit=items, batch_size=batch_size, share_context=share_context
        )
        cpu_s[mode] = harness.cpu_seconds() - cpu_started
        print(f"speed-up {mode}: {results[mode].elapsed_s:.1f} s", flush=True)
    reference = results["one_by_one"]
    entry: dict[str, Any] = {
        "task": "arc_easy",
        "items": reference.n,
        "requests": reference.protocol["requests"],
    }
    for mode, result in results.items():
        diffs = [
            abs(a - b)
            for mine, ref in zip(result.doc_scores, reference.doc_scores, strict=True)
            for a, b in zip(mine.loglikelihoods, ref.loglikelihoods, strict=True)
        ]
        entry[mode] = {
            "elapsed_s": round(result.elapsed_s, 2),
            "cpu_s": round(cpu_s[mode], 2),
            "forward_passes": result.protocol["forward_passes"],
            "speedup_vs_one_by_one": round(reference.elapsed_s / result.elapsed_s, 2),
            "max_abs_loglikelihood_diff": max(diffs),
            "same_acc_and_acc_norm": (result.acc, result.acc_norm) == (reference.acc, reference.acc_norm),
        }
    return entry


def task_entry(result: TaskResult) -> dict[str, Any]:
    ref_acc, ref_norm = REFERENCE[result.task]
    entry: dict[str, Any] = {
        **{name: round(value, 4) for name, value in result.metrics().items()},
        "n": result.n,
        "chance": round(result.chance, 4),
        "split": result.split,
        "elapsed_s": round(result.elapsed_s, 1),
        "reference": {"acc": ref_acc, "acc_norm": ref_norm},
        "diff_acc": round(result.acc - ref_acc, 4),
        "within_tolerance": abs(result.acc - ref_acc) <= TOLERANCE,
        "data_sha256": result.data_sha256,
        "protocol": result.protocol,
    }
    if ref_norm is not None and result.acc_norm is not None:
        entry["diff_acc_norm"] = round(result.acc_norm - ref_norm, 4)
        entry["within_tolerance"] = entry["within_tolerance"] and abs(result.acc_norm - ref_norm) <= TOLERANCE
        entry["diagnostic_acc_norm_counting_delimiter"] = round(acc_norm_counting_delimiter(result), 4)
    return entry


def acc_norm_counting_delimiter(result: TaskResult) -> float:
    """Diagnostic only, not a metric of the engine: acc_norm if each option's length counted the
    leading space it is scored with (len(" " + option), the whole continuation string) instead of
    lm-eval's len(option). Explains acc_norm gaps to references measured that way."""
    docs = load_task(result.task, split=result.split).docs[: result.n]
    hits = 0.0
    for doc, score in zip(docs, result.doc_scores, strict=True):
        lengths = [len(doc.target_delimiter + choice) for choice in doc.choices]
        normed = [ll / length for ll, length in zip(score.loglikelihoods, lengths, strict=True)]
        hits += float(max(range(len(normed)), key=lambda i: (normed[i], -i)) == doc.gold)
    return hits / len(docs)


def format_row(name: str, entry: dict[str, Any]) -> str:
    norm = f"{entry['acc_norm']:.3f}" if "acc_norm" in entry else "  -  "
    ref_acc, ref_norm = entry["reference"]["acc"], entry["reference"]["acc_norm"]
    ref = f"{ref_acc:.3f}/{ref_norm:.3f}" if ref_norm is not None else f"{ref_acc:.3f}"
    status = "ok" if entry["within_tolerance"] else "DIFF"
    return (
        f"{name:14s} acc {entry['acc']:.3f}±{entry['acc_stderr']:.3f} acc_norm {norm} "
        f"(ref {ref}) {status}  n={entry['n']} {entry['elapsed_s']:.0f} s"
    )


if __name__ == "__main__":
    main()
