"""Simulated curves against the methods themselves on the packaged models (issue 31).

Usage (from the repository root; Gemma needs its packaged wheels, see README.md):

    HF_HUB_OFFLINE=1 .venv/bin/python bench/simulate_curves.py --models smollm2-135m gemma-3-270m

Per model (fp32, CPU, `--threads`), calibration `--calibration` BoolQ passages x 512 tokens (seed 42),
evaluation the first `--windows` WikiText-2 test windows of 512. Every number below is scored on those
same windows:

- the truth: SliceGPT per-layer by the service's own sweep engine (slice a fresh dense copy, then the
  perplexity protocol) at 0.1..0.5; stock by `slice_model_stock` at 0.3 (its simulation is claimed
  exact: checked there); Wanda and SparseGPT at 0.1..0.6 by their anchors (the method's own
  statistics of its pruned stream, `workers.simulation.masking`), checked against `prune_model` at 0.3;
  magnitude (claimed exact) checked against `prune_model` at 0.3;
- the simulations: per-layer with dense-stream bases, and with sequential bases from 1/4 and 1/2 of
  the calibration windows; stock; Wanda from dense statistics; SparseGPT as Wanda's mask (a bound);
  magnitude;
- per point |ln(sim / truth)| at face value, scaled by one anchor (0.2) and by two (0.2 and 0.4;
  `core.prediction.anchoring`); the zero-point variant (c from the other model's two anchors) once both
  models ran;
- cost: the wall time of each simulation beside the sweep's (SliceGPT) and one dense pass of the
  evaluation windows.

Writes bench/out/simulate_curves.json (git-ignored) after every step, and prints a summary.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import time
from typing import Any

import harness
import torch

from core.methods import METHODS
from core.prediction.anchoring import Anchor, fit_scale
from core.prediction.sampling import sampled_band
from core.settings import Settings
from core.specs.simulate import DEFAULT_BASIS_FRACTION
from workers.evaluation.perplexity import perplexity
from workers.loading import refresh_model
from workers.pruning import prune_model
from workers.simulation import ANCHOR, SIMULATED, SimulationOptions, simulate_curve
from workers.slicing.engine import slice_model
from workers.slicing.stock import slice_model_stock

SEQLEN = 512
SLICING = [0.1, 0.2, 0.3, 0.4, 0.5]
MASKS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
CHECK_AT = 0.3
DEFAULTS: dict[str, Any] = {"calibration_batch_size": 8, "eval_batch_size": 1, "bases": "sequential"}
FRACTIONS = (0.25, 0.5, DEFAULT_BASIS_FRACTION)  # of the calibration windows, for sequential bases
ONE_ANCHOR = (0.2,)
TWO_ANCHORS = (0.2, 0.4)


def subset_windows(args: argparse.Namespace) -> int:
    """The windows a cheaper simulation scores (its band covers the rest: `band_coverage`)."""
    return max(2, args.windows // 4)


def scored(curve: dict[float, float], truth: dict[float, float], dense: float) -> dict[str, Any]:
    """|ln(sim / truth)| per sparsity at face value and through one and two anchors of the truth."""
    result: dict[str, Any] = {}
    for label, anchors in (("face", ()), ("one_anchor", ONE_ANCHOR), ("two_anchors", TWO_ANCHORS)):
        scale = fit_scale([Anchor(s, curve[s], truth[s]) for s in anchors], dense) if anchors else None
        errors = {}
        for s, value in curve.items():
            predicted = value if scale is None else scale.apply(s, value, dense)
            errors[s] = abs(math.log(predicted / truth[s]))
        held = [e for s, e in errors.items() if s not in anchors]
        result[label] = {
            "errors": errors,
            "median": statistics.median(held),
            "max": max(held),
            "scale": None if scale is None else scale.to_dict(),
        }
    return result


class Bench:
    def __init__(self, name: str, args: argparse.Namespace, settings: Settings) -> None:
        self.args = args
        self.loaded = harness.load_dense(name, settings)
        ids = harness.wikitext_ids(self.loaded, settings)
        self.windows = ids[: args.windows * SEQLEN].view(args.windows, SEQLEN)
        batch = harness.calibration_batch(self.loaded.tokenizer, settings, args.calibration, SEQLEN, 42)
        self.calibration = batch.input_ids
        self.mask = batch.attention_mask

    def ppl(self, model: torch.nn.Module) -> tuple[float, float]:
        started = time.perf_counter()
        value = perplexity(model, self.windows.reshape(-1), seqlen=SEQLEN).ppl
        return value, time.perf_counter() - started

    def simulate(
        self, method: str, sparsities: list[float], anchors: list[float], **options: Any
    ) -> dict[str, Any]:
        started = time.perf_counter()
        report = simulate_curve(
            self.loaded.model,
            method,
            self.windows,
            sparsities,
            anchors=anchors,
            calibration_ids=self.calibration,
            attention_mask=self.mask,
            options=SimulationOptions(**{**DEFAULTS, **options}),
        )
        wall = time.perf_counter() - started
        curves: dict[str, dict[float, float]] = {SIMULATED: {}, ANCHOR: {}}
        windows: dict[float, list[float]] = {}
        for point in report.points:
            curves[point.role][point.sparsity] = point.scores.ppl
            if point.role == SIMULATED:
                windows[point.sparsity] = (point.scores.nll / point.scores.tokens_per_window).tolist()
        print(method, options, f"{wall:.1f}s", curves, flush=True)
        return {
            "wall_s": wall,
            "face": curves[SIMULATED],
            "anchor": curves[ANCHOR],
            "window_nll": windows,
            "engine": report.timings,
        }


def measure(name: str, args: argparse.Namespace, settings: Settings, out: dict[str, Any], save: Any) -> None:
    bench = Bench(name, args, settings)
    record: dict[str, Any] = out["models"].setdefault(name, {})
    if "slicegpt" not in record:  # a rerun with --out of an earlier run keeps its truth and sweep time
        dense, dense_s = bench.ppl(bench.loaded.model)
        record["dense"] = {"ppl": dense, "wall_s": dense_s}
        print(name, "dense", dense, f"{dense_s:.1f}s", flush=True)
        record["slicegpt"] = sweep(bench, name)
        save()
    measure_slicing(bench, args, record, save)
    for method in ("wanda", "sparsegpt"):  # what the face value alone costs, without the anchors' truth
        if args.costs and method in record and "face_wall_s" not in record[method]:
            record[method]["face_wall_s"] = bench.simulate(method, MASKS, [])["wall_s"]
            save()
    if args.slicing_only:
        return
    measure_stock(bench, record)
    save()
    for method in args.mask_methods:
        record[method] = measure_masks(bench, method, record["dense"]["ppl"])
        save()


def measure_slicing(bench: Bench, args: argparse.Namespace, record: dict[str, Any], save: Any) -> None:
    """Per-layer SliceGPT: each variant against the sweep's truth, and the job's defaults' cost with one
    anchor, scoring every window and a quarter of them. What an earlier run stored is kept."""
    dense, truth = record["dense"]["ppl"], {float(s): v for s, v in record["slicegpt"]["truth"].items()}
    sweep_s = record["slicegpt"]["sweep_wall_s"]
    windows = {f"sequential_{k}": k for k in sorted({max(1, round(f * args.calibration)) for f in FRACTIONS})}
    variants = {"dense_bases": dict(bases="dense")}
    variants |= {label: dict(bases="sequential", basis_windows=k) for label, k in windows.items()}
    for label, options in variants.items():
        if label not in record["slicegpt"]:
            run = bench.simulate("slicegpt", SLICING, [], **options)
            record["slicegpt"][label] = {**run, "scores": scored(run["face"], truth, dense)}
            save()
    every, part = bench.windows, bench.windows[: subset_windows(args)]
    for scored_windows in (every, part) if args.costs else ():
        label = f"cost_one_anchor_{DEFAULTS['basis_windows']}_scoring_{scored_windows.shape[0]}_windows"
        if label in record["slicegpt"]:
            continue
        bench.windows = scored_windows
        run = bench.simulate("slicegpt", SLICING, list(ONE_ANCHOR))  # the job's defaults
        bench.windows = every
        record["slicegpt"][label] = {"wall_s": run["wall_s"], "over_sweep": run["wall_s"] / sweep_s}
        if scored_windows is every:
            record["slicegpt"][label]["anchor_vs_sweep"] = {
                s: abs(math.log(run["anchor"][s] / truth[s])) for s in run["anchor"]
            }
        save()


def measure_stock(bench: Bench, record: dict[str, Any]) -> None:
    """Stock: claimed exact; checked against the stock engine at CHECK_AT."""
    try:
        run = bench.simulate("slicegpt", SLICING, [], layout="stock")
    except ValueError as error:  # Gemma: the stock layout refuses branch-output norms
        record["slicegpt-stock"] = {"refused": str(error)}
        return
    sliced = copy.deepcopy(bench.loaded.model)
    slice_model_stock(sliced, bench.calibration, bench.mask, CHECK_AT, batch_size=8)
    stock_truth = bench.ppl(sliced)[0]
    del sliced
    error = abs(math.log(run["face"][CHECK_AT] / stock_truth))
    record["slicegpt-stock"] = {**run, "check": {"sparsity": CHECK_AT, "engine": stock_truth, "error": error}}


def measure_masks(bench: Bench, method: str, dense: float) -> dict[str, Any]:
    """A mask method: its anchors (the method itself) are the truth, checked against prune_model."""
    run = bench.simulate(method, MASKS, MASKS if METHODS[method].calibrated else [])
    truth = run["anchor"] or run["face"]
    pruned = copy.deepcopy(bench.loaded.model)
    prune_model(pruned, method, CHECK_AT, calibration_ids=bench.calibration, attention_mask=bench.mask)
    engine = bench.ppl(pruned)[0]
    del pruned
    error = abs(math.log(truth[CHECK_AT] / engine))
    return {
        **run,
        "truth": truth,
        "check": {"sparsity": CHECK_AT, "engine": engine, "error": error},
        "scores": scored(run["face"], truth, dense),
    }


def band_coverage(out: dict[str, Any], scored_windows: int) -> dict[str, Any]:
    """Does the band (`core.prediction.sampling`) of a simulation scored on its first `scored_windows`
    windows cover the value over every window? One check per model, simulation and sparsity."""
    checks = []
    for model, record in out["models"].items():
        runs = [(m, r) for m, r in record.items() if isinstance(r, dict) and "window_nll" in r]
        runs += [
            (f"slicegpt {k}", r)
            for k, r in record.get("slicegpt", {}).items()
            if isinstance(r, dict) and "window_nll" in r
        ]
        for label, run in runs:
            for s, per_window in run["window_nll"].items():
                band = sampled_band(per_window[:scored_windows], len(per_window))
                assert band is not None
                full = math.exp(statistics.fmean(per_window))
                checks.append(
                    {"model": model, "run": label, "sparsity": s, "covered": band.low <= full <= band.high}
                )
    misses = [check for check in checks if not check["covered"]]
    return {
        "scored_windows": scored_windows,
        "checks": len(checks),
        "covered": len(checks) - len(misses),
        "misses": misses,
    }


def sweep(bench: Bench, name: str) -> dict[str, Any]:
    """SliceGPT per-layer by the service's own engine at every SLICING sparsity: the truth."""
    truth: dict[float, float] = {}
    started = time.perf_counter()
    for s in SLICING:
        refresh_model(bench.loaded)
        slice_model(bench.loaded.model, bench.calibration, bench.mask, s, batch_size=8)
        truth[s] = bench.ppl(bench.loaded.model)[0]
        print(name, "sliced", s, truth[s], flush=True)
    wall = time.perf_counter() - started
    refresh_model(bench.loaded)
    return {"truth": truth, "sweep_wall_s": wall}


def zero_points(out: dict[str, Any]) -> dict[str, Any]:
    """Each model's face values scaled by the other model's c: constant from its anchor at 0.2, and the
    line through its anchors at 0.2 and 0.4."""
    models = list(out["models"])
    result: dict[str, Any] = {}
    if len(models) != 2:
        return result
    slicing = (f"sequential_{DEFAULTS['basis_windows']}", "dense_bases")
    for this, other in (models, models[::-1]):
        for method, curve in [("slicegpt", c) for c in slicing] + [("wanda", None), ("sparsegpt", None)]:
            mine, theirs = out["models"][this].get(method), out["models"][other].get(method)
            if curve is not None:  # slicing: that variant's face values, the sweep's truth
                if not mine or not theirs or curve not in mine or curve not in theirs:
                    continue
                mine, theirs = (
                    {**mine, "face": mine[curve]["face"]},
                    {**theirs, "face": theirs[curve]["face"]},
                )
            if not mine or not theirs:
                continue
            face, truth = _floats(mine["face"]), _floats(mine["truth"])
            their_face, their_truth = _floats(theirs["face"]), _floats(theirs["truth"])
            dense, their_dense = out["models"][this]["dense"]["ppl"], out["models"][other]["dense"]["ppl"]
            for label, anchors in (("one_anchor", ONE_ANCHOR), ("two_anchors", TWO_ANCHORS)):
                scale = fit_scale([Anchor(s, their_face[s], their_truth[s]) for s in anchors], their_dense)
                assert scale is not None
                errors = {s: abs(math.log(scale.apply(s, v, dense) / truth[s])) for s, v in face.items()}
                variant = "" if curve is None else f" {curve}"
                result[f"{this} {method}{variant}, c from {other} ({label})"] = {
                    "errors": errors,
                    "median": statistics.median(errors.values()),
                    "max": max(errors.values()),
                    "c": scale.to_dict(),
                }
    return result


def _floats(curve: dict[Any, float]) -> dict[float, float]:
    """A curve's points keyed by float sparsity (JSON turned them into strings)."""
    return {float(s): v for s, v in curve.items()}


def main() -> None:
    made = harness.parser(__doc__, "simulate_curves")
    harness.add_models_args(made)
    made.add_argument("--calibration", type=int, default=32)
    made.add_argument("--windows", type=int, default=16)
    made.add_argument(
        "--summary-only", dest="measure", action="store_false", help="recompute the summaries of --out"
    )
    made.add_argument(
        "--no-costs", dest="costs", action="store_false", help="skip the runs that only time the defaults"
    )
    made.add_argument("--mask-methods", nargs="*", default=["wanda", "sparsegpt", "magnitude"])
    made.add_argument(
        "--slicing-only", action="store_true", help="per-layer SliceGPT only (stock and masks are skipped)"
    )
    args, settings = harness.parse_engine(made)
    DEFAULTS["basis_windows"] = max(1, round(DEFAULT_BASIS_FRACTION * args.calibration))
    protocol = harness.simulation_protocol(args, SEQLEN)
    out = harness.start_report(protocol=protocol, models={})
    if args.out.exists():  # fill in what an earlier run of the same protocol left out
        earlier = json.loads(args.out.read_text())
        if earlier.get("protocol") == out["protocol"]:
            out["models"] = earlier["models"]
    wall_started, cpu_started = time.perf_counter(), harness.cpu_seconds()

    def save(done: bool = False) -> None:
        out["load_average_now"] = list(os.getloadavg())
        out["wall_s"] = time.perf_counter() - wall_started
        out["cpu_s"] = harness.cpu_seconds() - cpu_started
        (harness.finish_report if done else harness.write_report)(args.out, out)

    for name in args.models if args.measure else ():
        measure(name, args, settings, out, save)
    out["zero_points"] = zero_points(out)
    out["band_coverage"] = band_coverage(out, subset_windows(args))
    save(done=True)
    print(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
