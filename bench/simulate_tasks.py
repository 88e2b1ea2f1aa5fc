"""Task scores on simulated models against the pruned models themselves (issue 31, item 5).

Usage (from the repository root; Gemma needs its packaged wheels, see README.md):

    HF_HUB_OFFLINE=1 .venv/bin/python bench/simulate_tasks.py --models smollm2-135m --limit 200

Per model (fp32, CPU, `--threads`), calibration `--calibration` BoolQ passages x 512 tokens (seed 42,
as `simulate_curves.py`), and per method and sparsity (`--methods`, `--sparsities`):

- simulated: the job's engine with `keep_models` (`workers.simulation.whole_models`): SliceGPT with its
  default sequential bases from three quarters of the calibration windows, Wanda's face masks from the
  dense stream's input norms, magnitude's masks; each simulated sparsity's whole model scored on the
  tasks through the model's own forward;
- truth: the method itself on a fresh copy (`slice_model` from every calibration window, `prune_model`),
  scored on the same docs;
- per task and point: both accuracies, their difference in points, and the measured score's standard
  error (the two are scored on the same docs, so their difference varies less than two errors would);
- cost: the simulation pass (two evaluation windows: it is not what is measured here), each whole
  model's task scoring, and the method's pruning and scoring.

Writes bench/out/simulate_tasks.json (git-ignored) after every point, and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import harness
import torch

from core.specs.simulate import DEFAULT_BASIS_FRACTION
from workers.evaluation.task_scoring import FEWSHOT_SEED, score_requested_task, task_request
from workers.loading import LoadedModel, refresh_model
from workers.pruning import prune_model
from workers.simulation import SimulationOptions, simulate_curve
from workers.simulation.whole_models import SimulatedModel
from workers.slicing.engine import slice_model

SEQLEN = 512


def scores(model: torch.nn.Module, tokenizer: Any, args: argparse.Namespace) -> tuple[dict[str, Any], float]:
    """Each task's metrics (value, stderr) on `model`, and the wall time of scoring them all."""
    started = time.perf_counter()
    found: dict[str, Any] = {}
    for name in args.tasks:
        request = task_request(
            name,
            limit=args.limit,
            subsample_seed=0,
            num_fewshot=None,
            max_new_tokens=None,
            batch_size=16,
            fewshot_seed=FEWSHOT_SEED,
        )
        scored = score_requested_task(model, tokenizer, request)
        found[name] = {"n": scored.n, **{m: list(v) for m, v in scored.metric_values().items()}}
    return found, time.perf_counter() - started


def compare(
    loaded: LoadedModel, simulated: SimulatedModel, method: str, batch: Any, args: argparse.Namespace
) -> dict[str, Any]:
    """One simulated sparsity's task scores beside the method's own, with what each cost."""
    model, tokenizer, sparsity = loaded.model, loaded.tokenizer, simulated.sparsity
    with simulated.applied(model):
        face, face_s = scores(model, tokenizer, args)
    refresh_model(loaded)
    started = time.perf_counter()
    if method == "slicegpt":
        slice_model(model, batch.input_ids, batch.attention_mask, sparsity, batch_size=8)
    else:
        prune_model(model, method, sparsity, calibration_ids=batch.input_ids, batch_size=8)
    prune_s = time.perf_counter() - started
    truth, truth_s = scores(model, tokenizer, args)
    refresh_model(loaded)
    return {
        "simulated": face,
        "simulated_scoring_s": face_s,
        "measured": truth,
        "pruning_s": prune_s,
        "measured_scoring_s": truth_s,
        "difference_points": {
            t: round(100 * (face[t]["acc"][0] - truth[t]["acc"][0]), 2) for t in args.tasks
        },
        "measured_stderr_points": {t: round(100 * (truth[t]["acc"][1] or 0.0), 2) for t in args.tasks},
    }


def main() -> None:
    made = harness.parser(__doc__, "simulate_tasks")
    harness.add_models_args(made, ("smollm2-135m",))
    made.add_argument("--methods", nargs="+", default=["magnitude", "wanda", "slicegpt"])
    made.add_argument("--sparsities", nargs="+", type=float, default=[0.2, 0.4])
    made.add_argument("--tasks", nargs="+", default=["arc_easy", "lambada_openai"])
    made.add_argument("--limit", type=int, default=200)
    made.add_argument("--calibration", type=int, default=32)
    args, settings = harness.parse_engine(made)
    protocol = {
        "calibration": f"{args.calibration} BoolQ passages x {SEQLEN}, seed 42",
        "tasks": args.tasks,
        "limit": args.limit,
        "subsample_seed": 0,
        "dtype": "float32",
        "threads": args.threads,
        "sequential_basis_fraction": DEFAULT_BASIS_FRACTION,
    }
    out = harness.start_report(protocol=protocol, models={})

    def save() -> None:
        out["load_average_now"] = list(os.getloadavg())
        harness.write_report(args.out, out)

    for name in args.models:
        loaded = harness.load_dense(name, settings)
        windows = harness.wikitext_ids(loaded, settings)[: 2 * SEQLEN]
        batch = harness.calibration_batch(loaded.tokenizer, settings, args.calibration, SEQLEN, 42)
        record: dict[str, Any] = {}
        out["models"][name] = record
        record["dense"], record["dense_wall_s"] = scores(loaded.model, loaded.tokenizer, args)
        save()
        for method in args.methods:
            started = time.perf_counter()
            report = simulate_curve(
                loaded.model,
                method,
                windows.view(2, SEQLEN),
                args.sparsities,
                calibration_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                options=SimulationOptions(
                    calibration_batch_size=8,
                    basis_windows=max(8, round(DEFAULT_BASIS_FRACTION * args.calibration)),
                    keep_models=True,
                ),
            )
            points: dict[str, Any] = {"simulation_wall_s": time.perf_counter() - started, "points": {}}
            record[method] = points
            for simulated in report.models:
                found = compare(loaded, simulated, method, batch, args)
                points["points"][str(simulated.sparsity)] = found
                print(name, method, simulated.sparsity, found, flush=True)
                save()
            del report
    harness.finish_report(args.out, out)
    print(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
