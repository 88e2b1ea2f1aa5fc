"""Deviation probing of SmolLM2-135M pruned with Wanda 50% unstructured and with attention-layer drop
of 8 layers (issue 6): the per-layer counterfactual over all 30 layers, its cost as a multiple of
one dense pass, how well the Taylor estimates track the exact deviations, and which space deviates
most.

Usage (from the repository root):

    HF_HUB_OFFLINE=1 .venv/bin/python bench/probe_smollm2.py
    HF_HUB_OFFLINE=1 .venv/bin/python bench/probe_smollm2.py --calibration-sequences 8 --max-new-tokens 8

Per pruning, in one process and side by side:
1. prune a second copy of the model (calibration: BoolQ Wikipedia passages, seeded windows);
2. time one dense forward over the built-in prompts (best of three) and the counterfactual probe
   (attention, MLP and whole-block swaps at every layer) over the same prompts: their ratio is the
   probe's cost in dense passes; the block-forward cost and the logit-lens (final norm + head per
   layer and variant) cost are reported apart, since the head is most of it for a 49k vocabulary;
3. Pearson correlation of the Taylor estimate with the exact value across layers 2..L-1 (counted
   from 1: every block but the first and the last), per sublayer and space (KL in probability
   space is the one the research reports), on the values and on their logarithms;
4. mean deviation per space (embedding, logits, probabilities: 1 - cos) over the layers, to check
   whether the probability space deviates most, as the research says;
5. the full-model, generation and multiple-choice probes, summarised.

Writes bench/out/probe_smollm2.json (git-ignored) and prints it; with --plots, also each pruning's
points (bench/out/probe_smollm2_<pruning>_points.json) and the service's three probe views of them
as PNG (bench/out/probe_smollm2_<pruning>_<view>.png), drawn by the same code as
GET /v1/jobs/{id}/probes/plot.png.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import harness
import torch

from app.schemas.probes import ProbePointPublic
from app.views.probe_plots import NoProbePoints, build_figure, figure_png
from core.settings import Settings
from workers.probing import (
    BUILTIN_PROMPTS,
    ProbeRecord,
    counterfactual_probe,
    generation_probe,
    mc_subspace_probe,
    model_probe,
)
from workers.probing.decoding import TEACHER_FORCED, decoding_counterfactual_probe, teacher_forced_probe

SPACES = ("embedding", "logits", "probs")


def parse_args() -> tuple[argparse.Namespace, Settings]:
    made = harness.parser(__doc__, "probe_smollm2")
    harness.add_model_args(made)
    harness.add_store_args(made)
    harness.add_calibration_args(made, sequences=32, length=512)
    made.add_argument("--attention-layers", type=int, default=8, help="attention branches to drop")
    made.add_argument("--wanda-sparsity", type=float, default=0.5)
    made.add_argument("--max-new-tokens", type=int, default=24)
    made.add_argument(
        "--decoding-steps",
        type=int,
        default=8,
        help="counterfactual and teacher forcing at this many steps of the dense greedy generation; 0: none",
    )
    made.add_argument("--temperature", type=float, default=1.0)
    made.add_argument("--seed", type=int, default=42, help="the calibration's and the sampling's seed")
    made.add_argument("--plots", action="store_true", help="also write the points and PNG plots")
    return harness.parse_engine(made)


@torch.no_grad()
def dense_pass_s(model: torch.nn.Module, input_ids: list[torch.Tensor]) -> float:
    best = math.inf
    for _ in range(3):
        started = time.perf_counter()
        for ids in input_ids:
            model(input_ids=ids[None], use_cache=False)
        best = min(best, time.perf_counter() - started)
    return best


@torch.no_grad()
def head_s(model: Any, input_ids: list[torch.Tensor]) -> float:
    """One final norm + head over the prompts' tokens: the unit cost of a logit-lens reading."""
    hidden = [torch.randn(ids.numel(), model.config.hidden_size) for ids in input_ids]
    norm, head = model.model.norm, model.lm_head
    started = time.perf_counter()
    for h in hidden:
        torch.log_softmax(head(norm(h)), dim=-1)
    return time.perf_counter() - started


def pearson(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 3 or statistics.pstdev(xs) == 0 or statistics.pstdev(ys) == 0:
        return None
    return statistics.correlation(xs, ys)


def summarise_counterfactual(
    records: list[ProbeRecord], num_layers: int, *, decoding: bool = False
) -> dict[str, Any]:
    """Tracking over layers 2..L-1: of the prompt points, or (`decoding`) of the decoding-step points,
    every (layer, step) of those layers pooled."""
    by_key: dict[tuple[str, str, str], list[ProbeRecord]] = defaultdict(list)
    for record in records:
        if record.probe == "counterfactual" and (record.step is not None) == decoding:
            by_key[(str(record.sublayer), record.space, record.metric)].append(record)
    tracking: dict[str, Any] = {}
    deviation: dict[str, dict[str, float]] = defaultdict(dict)
    for (sublayer, space, metric), rows in sorted(by_key.items()):
        rows = sorted(rows, key=lambda r: r.layer or 0)
        # Layers 2..L-1 counted from 1, i.e. all but the first and the last block.
        middle = [r for r in rows if r.layer is not None and 1 <= r.layer <= num_layers - 2]
        if rows[0].estimate is not None:
            values = [r.value for r in middle]
            estimates = [float(r.estimate or 0.0) for r in middle]
            tracking[f"{sublayer}/{space}/{metric}"] = {
                "points": len(middle),
                "pearson_layers_2_to_L-1": pearson(estimates, values),
                "pearson_log": pearson(
                    [math.log(max(e, 1e-30)) for e in estimates], [math.log(max(v, 1e-30)) for v in values]
                ),
                "median_estimate_over_value": statistics.median(
                    e / v for e, v in zip(estimates, values, strict=True) if v > 0
                )
                if any(v > 0 for v in values)
                else None,
            }
        if metric == "1-cos":
            deviation[sublayer][space] = statistics.fmean(r.value for r in rows)
    ordering = {
        sublayer: {
            "mean_1-cos": spaces,
            "probs_exceeds_logits_and_embedding": spaces.get("probs", 0)
            > max(spaces.get("logits", 0), spaces.get("embedding", 0)),
            "layers_where_probs_exceeds_both": sum(
                1
                for layer in range(num_layers)
                if _at(records, sublayer, "probs", layer)
                > max(_at(records, sublayer, "logits", layer), _at(records, sublayer, "embedding", layer))
            ),
        }
        for sublayer, spaces in deviation.items()
    }
    return {"tracking": tracking, "deviation_by_space": ordering}


def _at(records: list[ProbeRecord], sublayer: str, space: str, layer: int) -> float:
    for record in records:
        if (
            record.probe == "counterfactual"
            and record.sublayer == sublayer
            and record.space == space
            and record.layer == layer
            and record.metric == "1-cos"
        ):
            return record.value
    return -math.inf


def summarise_other(records: list[ProbeRecord]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for record in records:
        if record.probe == "model" or record.probe == "mc-subspace":
            out[f"{record.probe}/{record.space}/{record.metric}"] = {
                "value": record.value,
                "estimate": record.estimate,
            }
    for probe in ("generation-greedy", "generation-sampled", TEACHER_FORCED):
        steps = sorted(
            (
                r
                for r in records
                if r.probe == probe and r.layer is None and r.space == "probs" and r.metric == "kl"
            ),
            key=lambda r: r.step or 0,
        )
        agree = sorted(
            (r for r in records if r.probe == probe and r.metric == "prefix_agree"), key=lambda r: r.step or 0
        )
        out[probe] = {
            "kl_by_step": [round(r.value, 5) for r in steps],
            "prefix_agree_by_step": [round(r.value, 3) for r in agree],
        }
    return out


def write_plots(folder: Path, name: str, records: list[ProbeRecord]) -> None:
    """The points as the API returns them, and the three probe views as PNG."""
    points = [
        ProbePointPublic(id=index, job_id=f"bench-{name}", **dataclasses.asdict(record))
        for index, record in enumerate(records, start=1)
    ]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"probe_smollm2_{name}_points.json").write_text(
        json.dumps([point.model_dump() for point in points])
    )
    sublayer = "attention" if name.startswith("attention") else "block"
    for view in ("layers", "heatmap", "generation"):
        try:
            figure = build_figure(
                view, points, probe=None, sublayer=sublayer, metric="1-cos", title=f"SmolLM2-135M {name}"
            )
        except NoProbePoints:
            continue
        (folder / f"probe_smollm2_{name}_{view}.png").write_bytes(figure_png(figure))


def main() -> None:
    args, settings = parse_args()
    torch.manual_seed(args.seed)
    dense = harness.load_dense(args.model, settings)
    num_layers = int(dense.model.config.num_hidden_layers)
    input_ids = [dense.tokenizer(p.text, return_tensors="pt").input_ids[0] for p in BUILTIN_PROMPTS]
    calibration = harness.calibration_for(dense, settings, args, args.seed)
    unit = dense_pass_s(dense.model, input_ids)
    head_unit = head_s(dense.model, input_ids)
    result = harness.start_report(
        model=args.model,
        layers=num_layers,
        prompts=len(input_ids),
        prompt_tokens=sum(int(ids.numel()) for ids in input_ids),
        calibration={"sequences": args.calibration_sequences, "length": args.calibration_length},
        temperature=args.temperature,
        dense_pass_s=unit,
        head_pass_s=head_unit,
        threads=args.threads,
        prunings={},
    )
    prunings = {
        f"wanda-{args.wanda_sparsity:g}": ("wanda", args.wanda_sparsity),
        f"attention-drop-{args.attention_layers}": ("attention-drop", args.attention_layers / num_layers),
    }
    for name, (method, sparsity) in prunings.items():
        pruned, report, pruning_s = harness.prune_copy(dense, method, sparsity, calibration)
        models, layer_map, temperature = (dense.model, pruned.model), list(report.layer_map), args.temperature
        started = time.perf_counter()
        counterfactual = counterfactual_probe(*models, layer_map, input_ids, temperature=temperature)
        counterfactual_s = time.perf_counter() - started
        started = time.perf_counter()
        other = model_probe(*models, input_ids, temperature=temperature)
        generation = {"max_new_tokens": args.max_new_tokens, "temperature": temperature, "seed": args.seed}
        other += generation_probe(*models, layer_map, input_ids, **generation)
        choice = [p for p in BUILTIN_PROMPTS if p.options]
        other += mc_subspace_probe(*models, dense.tokenizer, choice, temperature=temperature)
        other_s = time.perf_counter() - started
        started = time.perf_counter()
        decoding: list[ProbeRecord] = []
        if args.decoding_steps:
            steps = {"max_new_tokens": args.decoding_steps, "temperature": temperature}
            decoding = decoding_counterfactual_probe(*models, layer_map, input_ids, **steps)
            other += teacher_forced_probe(*models, input_ids, **steps)
        decoding_s = time.perf_counter() - started
        sublayers = {r.sublayer for r in counterfactual}
        readings = len({(r.layer, r.sublayer) for r in counterfactual}) + num_layers
        result["prunings"][name] = {
            "method": method,
            "sparsity": sparsity,
            "report": {k: v for k, v in report.to_dict().items() if k != "timings"},
            "pruning_s": pruning_s,
            "counterfactual_s": counterfactual_s,
            "counterfactual_cost_multiple": counterfactual_s / unit,
            "counterfactual_sublayers": sorted(str(s) for s in sublayers),
            # A lower bound of the block part: 1 + one block per layer and sublayer probed.
            "block_forward_multiple_lower_bound": 1 + len(sublayers),
            "logit_lens_readings": readings,
            "logit_lens_cost_multiple_estimate": readings * head_unit / unit,
            "other_probes_s": other_s,
            "counterfactual": summarise_counterfactual(counterfactual, num_layers),
            "decoding_steps": args.decoding_steps,
            "decoding_s": decoding_s,
            "decoding_counterfactual": summarise_counterfactual(decoding, num_layers, decoding=True)[
                "tracking"
            ],
            "other": summarise_other(other),
            "points": len(counterfactual) + len(other) + len(decoding),
        }
        if args.plots:
            write_plots(args.out.parent, name, counterfactual + other)
        del pruned
    harness.finish_report(args.out, result)
    print(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
