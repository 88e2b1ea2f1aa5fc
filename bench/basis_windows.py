"""What fewer basis windows cost a SliceGPT simulation, plain and corrected by regression (issue 41).

Usage (from the repository root; Gemma needs its packaged wheels, see README.md):

    HF_HUB_OFFLINE=1 .venv/bin/python bench/basis_windows.py --models smollm2-135m
    HF_HUB_OFFLINE=1 .venv/bin/python bench/basis_windows.py --models gemma-3-270m --subsets 8

Per model (fp32, CPU, `--threads`): calibration `--calibration` BoolQ passages x 512 (seed 42), the
first `--windows` WikiText-2 test windows of 512, s = 0.1..0.5, per-layer slicing. The reference
curve is the simulation with sequential bases from every calibration window, which is SliceGPT's own
bases (tests/workers/simulation: equal to the engine's sliced model on every family); each variant
takes its bases from the first k windows, `subset` (the projected stream of those windows alone) or
`regression` (that stream's moment carried to every window by the dense stream,
`workers.simulation.basis_regression`), and is scored by |ln(PPL_variant / PPL_every_window)| on the
same evaluation windows. Cost: each run's basis-stream seconds (`timings.bases`: block passes, moments
and eigendecompositions of the calibration streams) beside slicing's own per-sparsity calibration
(`slice_model` on a fresh copy, calibration only, its `timings.total`), side by side in one run.

Writes bench/out/basis_windows.json (git-ignored) after every step, and prints a summary.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

import harness
import torch

from core.settings import Settings
from workers.loading import load_copy
from workers.simulation import SIMULATED, SimulationOptions, simulate_curve
from workers.slicing.engine import slice_model

SEQLEN = 512
SPARSITIES = [0.1, 0.2, 0.3, 0.4, 0.5]
ESTIMATORS = ("subset", "regression")


class Bench:
    def __init__(self, name: str, args: Any, settings: Settings) -> None:
        self.loaded = harness.load_dense(name, settings)
        ids = harness.wikitext_ids(self.loaded, settings)
        self.windows = ids[: args.windows * SEQLEN].view(args.windows, SEQLEN)
        batch = harness.calibration_batch(self.loaded.tokenizer, settings, args.calibration, SEQLEN, 42)
        self.calibration, self.mask = batch.input_ids, batch.attention_mask

    def simulate(self, **options: Any) -> dict[str, Any]:
        started = time.perf_counter()
        report = simulate_curve(
            self.loaded.model,
            "slicegpt",
            self.windows,
            SPARSITIES,
            calibration_ids=self.calibration,
            attention_mask=self.mask,
            options=SimulationOptions(calibration_batch_size=8, eval_batch_size=1, **options),
        )
        curve = {p.sparsity: p.scores.ppl for p in report.points if p.role == SIMULATED}
        result = {"wall_s": time.perf_counter() - started, "curve": curve, "timings": report.timings}
        print({k: str(v) for k, v in options.items()}, f"{result['wall_s']:.1f}s", curve, flush=True)
        return result

    def slicing_costs(self) -> dict[float, float]:
        """Slicing's own calibration pass at each sparsity, on a fresh copy each time."""
        costs = {}
        for s in SPARSITIES:
            copy = load_copy(self.loaded)
            report = slice_model(copy.model, self.calibration, self.mask, s, batch_size=8)
            costs[s] = float(report.timings["total"])
            print("slice_model", s, f"{costs[s]:.1f}s", flush=True)
            del copy
        return costs


def errors(curve: dict[float, float], truth: dict[float, float]) -> dict[str, Any]:
    each = {s: abs(math.log(curve[s] / truth[s])) for s in SPARSITIES}
    signed = {s: math.log(curve[s] / truth[s]) for s in SPARSITIES}
    return {
        "each": each,
        "signed": signed,
        "median": statistics.median(each.values()),
        "max": max(each.values()),
    }


def measure(name: str, args: Any, settings: Settings, out: dict[str, Any], save: Any) -> None:
    bench = Bench(name, args, settings)
    record: dict[str, Any] = out["models"].setdefault(name, {"variants": {}})
    record["every_window"] = bench.simulate()
    save()
    truth = record["every_window"]["curve"]
    for dtype in args.stream_dtypes:
        if dtype == "float32":
            continue
        run = bench.simulate(streams_dtype=getattr(torch, dtype))
        run["errors"] = errors(run["curve"], truth)
        record["variants"][f"every_{dtype}"] = run
        save()
    for k in args.subsets:
        for estimator in args.estimators:
            for dtype in args.stream_dtypes:
                streams = {} if dtype == "float32" else {"streams_dtype": getattr(torch, dtype)}
                run = bench.simulate(basis_windows=k, basis_estimator=estimator, **streams)
                run["errors"] = errors(run["curve"], truth)
                suffix = "" if dtype == "float32" else f"_{dtype}"
                record["variants"][f"{estimator}_{k}{suffix}"] = run
                save()
    if args.slicing_costs:
        record["slice_model_s"] = bench.slicing_costs()
        save()


def summary(out: dict[str, Any]) -> None:
    for name, record in out["models"].items():
        every = record.get("every_window")
        if every is None:
            continue
        slicing = sum(record.get("slice_model_s", {}).values()) or None
        print(f"{name}: every window bases {every['timings'].get('bases', 0):.1f}s, slicing's {slicing}")
        for label, run in record["variants"].items():
            e = run["errors"]
            print(
                f"  {label:>14}: median {e['median']:.4f} max {e['max']:.4f}",
                f"bases {run['timings']['bases']:.1f}s",
            )


def main() -> None:
    made = harness.parser(__doc__, "basis_windows")
    harness.add_models_args(made, models=("smollm2-135m",))
    made.add_argument("--calibration", type=int, default=32)
    made.add_argument("--windows", type=int, default=8)
    made.add_argument("--subsets", type=int, nargs="+", default=[8, 16])
    made.add_argument("--estimators", nargs="+", default=list(ESTIMATORS), choices=ESTIMATORS)
    made.add_argument(
        "--stream-dtypes",
        nargs="+",
        default=["float32"],
        choices=["float32", "bfloat16"],
        help="dtypes of the calibration streams to try (the model and its evaluation stay float32)",
    )
    made.add_argument("--no-slicing-costs", dest="slicing_costs", action="store_false")
    args, settings = harness.parse_engine(made)
    protocol = harness.simulation_protocol(args, SEQLEN)
    out = harness.start_report(protocol=protocol, models={})

    def save() -> None:
        harness.write_report(args.out, out)

    for name in args.models:
        measure(name, args, settings, out, save)
    summary(out)
    harness.finish_report(args.out, out)


if __name__ == "__main__":
    main()
