"""The representation-hierarchy paper's findings checked on our models, under both probe conventions
(issue 34; docs/science.md §3).

Usage (from the repository root):

    HF_HUB_OFFLINE=1 .venv/bin/python bench/probe_findings.py --model smollm2-135m
    HF_HUB_OFFLINE=1 .venv/bin/python bench/probe_findings.py --model gemma-3-270m --decoding-steps 4

Per pruning (Wanda 50 % unstructured and 2:4, magnitude 50 %, attention-drop of 4 and 8 layers; one
calibration set of BoolQ passage windows, seeded) and per probe convention (`prunecast`: the paper's
text, prompt positions, T = 1; `released-code`: the authors' code, the last token of each decoding
step while the dense model samples, T = 0.5), every probe runs prompt by prompt on the 12 built-in
prompts, so that every number below has a bootstrap interval over prompts (resampling prompts, not
tokens: tokens of one prompt are not independent):

- **hierarchy**: per layer cell (layer x pruned sublayer, attention or MLP), 1 - cos in the
  probability space p against the logit space z and the embedding space h, each the mean over the
  prompts; the fraction of cells where p > z and where p > h, and the same claim on means over
  cells ("p deviates far more than h" held for means on SmolLM2 but not cell by cell);
- **Taylor tracking**: per space and KL, Pearson of the estimate against the exact value across
  cells, on values and on logs, and the median estimate / exact;
- **compounding**: per decoding step the output KL of free-running greedy generation (each model on
  its own text) against teacher forcing (the pruned model on the dense text); the gap, mean over
  steps 1.. of free minus forced, with its interval.

Writes bench/out/probe_findings_<model>.json (every cell's numbers too) and a PNG of the hierarchy
fractions with their intervals, and prints the summary table.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import harness
import torch

from core.probe_conventions import CONVENTIONS
from core.settings import Settings
from workers.probing import BUILTIN_PROMPTS, ProbeRecord, counterfactual_probe, generation_probe
from workers.probing.decoding import decoding_counterfactual_probe, teacher_forced_probe

SUBLAYERS = ("attention", "mlp")  # the cells the authors' code measures
SPACES = ("embedding", "logits", "probs")
Cell = tuple[int, str]  # (layer, sublayer)
AT_STEPS = "prunecast-at-steps"


def parse_args() -> tuple[argparse.Namespace, Settings]:
    made = harness.parser(__doc__, "probe_findings")
    made.set_defaults(out=None)  # bench/out/probe_findings_<model>.json
    harness.add_model_args(made)
    harness.add_store_args(made)
    harness.add_calibration_args(made, sequences=32, length=512)
    made.add_argument(
        "--prunings",
        nargs="+",
        default=["wanda-50%", "wanda-2:4", "magnitude-50%", "attention-drop-4", "attention-drop-8"],
    )
    made.add_argument(
        "--conventions",
        nargs="+",
        default=list(CONVENTIONS),
        help=f"of {', '.join(CONVENTIONS)}, or {AT_STEPS}: prunecast's rules read where the code reads "
        "(decoding steps, the dense model greedy), which separates the reading from the positions",
    )
    made.add_argument("--prompts", type=int, default=len(BUILTIN_PROMPTS), help="first N built-in prompts")
    made.add_argument(
        "--decoding-steps", type=int, default=6, help="steps of generation and of the code's reading"
    )
    made.add_argument("--bootstrap", type=int, default=2000, help="resamples of the prompts")
    made.add_argument(
        "--seed", type=int, default=42, help="the calibration's, the sampling's and the bootstrap's"
    )
    return harness.parse_engine(made)


def pruning_spec(name: str, layers: int) -> tuple[str, float, str]:
    """(method, sparsity, pattern) of a pruning name: `wanda-50%`, `wanda-2:4`, `attention-drop-8`."""
    method, _, amount = name.rpartition("-")
    if amount.endswith("%"):
        return method, float(amount[:-1]) / 100, "unstructured"
    if ":" in amount:
        n, m = (int(part) for part in amount.split(":"))
        return method, 1 - n / m, amount
    return method, int(amount) / layers, "unstructured"


def cell_values(records: list[ProbeRecord]) -> dict[Cell, dict[str, tuple[float, float | None]]]:
    """Per cell, (space/metric) -> (value, estimate): means over the prompt's positions or steps."""
    sums: dict[Cell, dict[str, list[tuple[float, float | None]]]] = defaultdict(lambda: defaultdict(list))
    for record in records:
        if record.probe == "counterfactual" and record.layer is not None and record.sublayer in SUBLAYERS:
            sums[(record.layer, str(record.sublayer))][f"{record.space}/{record.metric}"].append(
                (record.value, record.estimate)
            )
    out: dict[Cell, dict[str, tuple[float, float | None]]] = {}
    for cell, metrics in sums.items():
        out[cell] = {}
        for key, pairs in metrics.items():
            estimates = [e for _, e in pairs if e is not None]
            value = statistics.fmean(v for v, _ in pairs)
            out[cell][key] = (value, statistics.fmean(estimates) if len(estimates) == len(pairs) else None)
    return out


def output_kl_by_step(records: list[ProbeRecord], probe: str) -> list[float]:
    rows = [
        r for r in records if r.probe == probe and r.layer is None and (r.space, r.metric) == ("probs", "kl")
    ]
    return [r.value for r in sorted(rows, key=lambda r: r.step or 0)]


def interval(samples: torch.Tensor) -> list[float]:
    """The 2.5 % and 97.5 % quantiles of bootstrap samples."""
    return [float(torch.quantile(samples, 0.025)), float(torch.quantile(samples, 0.975))]


def pearson(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 3 or statistics.pstdev(xs) == 0 or statistics.pstdev(ys) == 0:
        return None
    return statistics.correlation(xs, ys)


def hierarchy(
    per_prompt: list[dict[Cell, dict[str, tuple[float, float | None]]]], resamples: int, seed: int
) -> dict[str, Any]:
    """Fractions of cells where p > z and p > h (means over prompts), with bootstrap intervals."""
    cells = sorted(set.intersection(*(set(values) for values in per_prompt)))
    if not cells:
        return {"cells": 0}
    space = {
        name: torch.tensor(
            [[prompt[cell][f"{name}/1-cos"][0] for cell in cells] for prompt in per_prompt],
            dtype=torch.float64,
        )
        for name in SPACES
    }  # (prompts, cells)
    generator = torch.Generator().manual_seed(seed)
    draws = torch.randint(0, len(per_prompt), (resamples, len(per_prompt)), generator=generator)

    def fractions(rows: torch.Tensor | None) -> dict[str, torch.Tensor]:
        means = {
            name: (values if rows is None else values[rows]).mean(dim=-2) for name, values in space.items()
        }
        p, z, h = means["probs"], means["logits"], means["embedding"]
        return {
            "p_over_z": (p > z).double().mean(dim=-1),
            "p_over_h": (p > h).double().mean(dim=-1),
            "mean_p_over_mean_z": p.mean(dim=-1) / z.mean(dim=-1),
            "mean_p_over_mean_h": p.mean(dim=-1) / h.mean(dim=-1),
            "median_cell_p_over_h": (p / h).median(dim=-1).values,
            "median_cell_p_over_z": (p / z).median(dim=-1).values,
        }

    point = fractions(None)
    boot = fractions(draws)
    means = {name: values.mean(dim=0) for name, values in space.items()}
    return {
        "cells": len(cells),
        **{key: {"value": float(value), "ci95": interval(boot[key])} for key, value in point.items()},
        "by_cell": {
            f"{layer}/{sublayer}": {name: float(means[name][index]) for name in SPACES}
            for index, (layer, sublayer) in enumerate(cells)
        },
    }


def tracking(per_prompt: list[dict[Cell, dict[str, tuple[float, float | None]]]]) -> dict[str, Any]:
    """Per space/metric with an estimate: Pearson of estimate vs value across cells (prompt means)."""
    cells = sorted(set.intersection(*(set(values) for values in per_prompt)))
    out: dict[str, Any] = {}
    for key in ("embedding/1-cos", "logits/1-cos", "probs/1-cos", "probs/kl"):
        values, estimates = [], []
        for cell in cells:
            pairs = [prompt[cell].get(key) for prompt in per_prompt]
            if any(pair is None or pair[1] is None for pair in pairs):
                continue
            values.append(statistics.fmean(pair[0] for pair in pairs if pair is not None))
            estimates.append(
                statistics.fmean(float(pair[1]) for pair in pairs if pair is not None and pair[1] is not None)
            )
        positive = [(e, v) for e, v in zip(estimates, values, strict=True) if e > 0 and v > 0]
        out[key] = {
            "cells": len(values),
            "pearson": pearson(estimates, values),
            "pearson_log": pearson([math.log(e) for e, _ in positive], [math.log(v) for _, v in positive]),
            "median_estimate_over_value": statistics.median(e / v for e, v in positive) if positive else None,
        }
    return out


def compounding(
    free: list[list[float]], forced: list[list[float]], resamples: int, seed: int
) -> dict[str, Any]:
    """Per step the mean output KL free-running and teacher-forced; the gap over steps 1.., bootstrapped."""
    free_t, forced_t = torch.tensor(free, dtype=torch.float64), torch.tensor(forced, dtype=torch.float64)
    gap = (free_t[:, 1:] - forced_t[:, 1:]).mean(dim=-1)  # (prompts,)
    generator = torch.Generator().manual_seed(seed)
    draws = torch.randint(0, gap.numel(), (resamples, gap.numel()), generator=generator)
    return {
        "free_kl_by_step": [round(float(v), 5) for v in free_t.mean(dim=0)],
        "forced_kl_by_step": [round(float(v), 5) for v in forced_t.mean(dim=0)],
        "gap_steps_1_on": {"value": float(gap.mean()), "ci95": interval(gap[draws].mean(dim=-1))},
        "free_over_forced_steps_1_on": float(free_t[:, 1:].mean() / forced_t[:, 1:].mean()),
    }


def run_convention(
    dense: Any,
    pruned: Any,
    layer_map: list[int | None],
    input_ids: list[torch.Tensor],
    name: str,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Every probe of one convention, prompt by prompt; the findings over prompts."""
    convention = CONVENTIONS["prunecast" if name == AT_STEPS else name]
    at_steps = convention.decoding_steps_only or name == AT_STEPS
    driver = "sampling" if convention.sampled_driver else "greedy"
    temperature = convention.temperature
    per_prompt, free, forced = [], [], []
    started = time.perf_counter()
    rules = {"temperature": temperature, "convention": convention}
    steps = {"max_new_tokens": args.decoding_steps, **rules}
    for index, ids in enumerate(input_ids):
        if at_steps:
            records = decoding_counterfactual_probe(
                dense, pruned, layer_map, [ids], sublayers=SUBLAYERS, seed=args.seed + index, **steps
            )
        else:
            records = counterfactual_probe(dense, pruned, layer_map, [ids], sublayers=SUBLAYERS, **rules)
        per_prompt.append(cell_values(records))
        generated = generation_probe(dense, pruned, layer_map, [ids], seed=args.seed + index, **steps)
        free.append(output_kl_by_step(generated, "generation-greedy"))
        teacher = teacher_forced_probe(dense, pruned, [ids], **steps)
        forced.append(output_kl_by_step(teacher, "generation-teacher-forced"))
        print(
            f"  {name}: {index + 1}/{len(input_ids)}, {time.perf_counter() - started:.0f} s",
            flush=True,
        )
    return {
        "temperature": temperature,
        "positions": (
            f"last token of each decoding step, the dense model {driver}"
            if at_steps
            else "every prompt position but the first"
        ),
        "seconds": round(time.perf_counter() - started, 1),
        "hierarchy": hierarchy(per_prompt, args.bootstrap, args.seed),
        "tracking": tracking(per_prompt),
        "compounding": compounding(free, forced, args.bootstrap, args.seed),
    }


def table(result: dict[str, Any]) -> str:
    """The findings as a Markdown table, one row per pruning and convention."""
    lines = [
        "| pruning | convention | cells | p > z | p > h | mean p / mean h | median cell p/h "
        "| KL Pearson (log) | KL est/exact | gap free - forced |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def ci(entry: dict[str, Any], digits: int = 2) -> str:
        low, high = entry["ci95"]
        return f"{entry['value']:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"

    for name, pruning in result["prunings"].items():
        for convention, found in pruning["conventions"].items():
            h = found["hierarchy"]
            if not h.get("cells"):
                continue
            kl = found["tracking"]["probs/kl"]
            log_r = kl["pearson_log"]
            ratio = kl["median_estimate_over_value"]
            lines.append(
                f"| {name} | {convention} | {h['cells']} | {ci(h['p_over_z'])} | {ci(h['p_over_h'])} | "
                f"{ci(h['mean_p_over_mean_h'])} | {ci(h['median_cell_p_over_h'])} | "
                f"{'-' if log_r is None else f'{log_r:.3f}'} | {'-' if ratio is None else f'{ratio:.3f}'} | "
                f"{ci(found['compounding']['gap_steps_1_on'], 3)} |"
            )
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    """Fractions of cells where p > z and p > h, per pruning and convention, with 95 % intervals."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10, 4.5))
    axes = figure.subplots(1, 2, sharey=True)
    names = list(result["prunings"])
    conventions = list(next(iter(result["prunings"].values()))["conventions"]) if names else []
    width = 0.8 / max(len(conventions), 1)
    for ax, key, label in zip(
        axes, ("p_over_z", "p_over_h"), ("p deviates more than z", "p deviates more than h"), strict=True
    ):
        for offset, convention in enumerate(conventions):
            xs, ys, low, high = [], [], [], []
            for index, name in enumerate(names):
                found = result["prunings"][name]["conventions"].get(convention, {}).get("hierarchy", {})
                if not found.get("cells"):
                    continue
                xs.append(index + (offset - (len(conventions) - 1) / 2) * width)
                ys.append(found[key]["value"])
                low.append(found[key]["value"] - found[key]["ci95"][0])
                high.append(found[key]["ci95"][1] - found[key]["value"])
            ax.bar(xs, ys, width, yerr=[low, high], capsize=3, label=convention)
        ax.axhline(0.5, color="grey", linewidth=0.8, linestyle=":")
        ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
        ax.set_title(f"{label}: share of layer cells", fontsize=10)
        ax.set_ylim(0, 1)
    axes[0].set_ylabel("share of (layer, sublayer) cells, 95 % CI over prompts")
    axes[1].legend(fontsize=8)
    figure.suptitle(
        f"{result['model']}: does probability space deviate most? (bench/probe_findings.py)", fontsize=11
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    args, settings = parse_args()
    torch.manual_seed(args.seed)
    out = args.out or harness.OUT_DIR / f"probe_findings_{args.model}.json"
    dense = harness.load_dense(args.model, settings)
    layers = int(dense.model.config.num_hidden_layers)
    input_ids = [
        dense.tokenizer(p.text, return_tensors="pt").input_ids[0] for p in BUILTIN_PROMPTS[: args.prompts]
    ]
    calibration = harness.calibration_for(dense, settings, args, args.seed)
    result = harness.start_report(
        model=args.model,
        layers=layers,
        prompts=len(input_ids),
        prompt_tokens=sum(int(ids.numel()) for ids in input_ids),
        decoding_steps=args.decoding_steps,
        sublayers=list(SUBLAYERS),
        calibration={
            "corpus": args.calibration_corpus,
            "sequences": args.calibration_sequences,
            "length": args.calibration_length,
            "seed": calibration.record["seed"],
        },
        bootstrap_resamples=args.bootstrap,
        conventions={
            name: {
                **CONVENTIONS["prunecast" if name == AT_STEPS else name].rules(),
                "at_steps": name == AT_STEPS,
            }
            for name in args.conventions
        },
        threads=args.threads,
        prunings={},
    )
    for name in args.prunings:
        method, sparsity, pattern = pruning_spec(name, layers)
        print(f"{name}: pruning ({method}, {sparsity:.4g}, {pattern})", flush=True)
        pruned, report, pruning_s = harness.prune_copy(dense, method, sparsity, calibration, pattern)
        entry: dict[str, Any] = {
            "method": method,
            "sparsity": sparsity,
            "pattern": pattern,
            "pruning_s": round(pruning_s, 1),
            "conventions": {},
        }
        for convention in args.conventions:
            entry["conventions"][convention] = run_convention(
                dense.model, pruned.model, list(report.layer_map), input_ids, convention, args
            )
        result["prunings"][name] = entry
        del pruned
        harness.write_report(out, result)  # after every pruning: a long run keeps its progress
    result["table"] = table(result)
    harness.finish_report(out, result)
    plot(result, out.with_suffix(".png"))
    print(result["table"])


if __name__ == "__main__":
    main()
