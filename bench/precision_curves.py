"""What a curve costs three ways, side by side: the sweep, the simulation on every window, and the
simulation at the default precision (issue 41); and a measured prune at the default precision.

Usage (from the repository root; a fresh store under --home, the app in-process with its embedded
worker, as `make run` serves it; Gemma needs its packaged wheels, see README.md):

    HF_HUB_OFFLINE=1 .venv/bin/python bench/precision_curves.py --home bench/out/precision-curves \\
        --model smollm2-135m --methods wanda magnitude slicegpt

Per model (fp32, CPU, `--threads`): calibration `--calibration-sequences` BoolQ passages x 512 tokens
(seed 42), evaluation the first `--windows` WikiText-2 test windows of 512, s = 0.1..0.5. Jobs, in
order, each timed by its wall clock:

1. `evaluate` on every window: the dense pass, whose per-window NLL every later job reuses;
2. per method, a `sweep` of the five sparsities (precision null: every window) - the truth;
3. a `simulate` with precision null (every window), and one at the default precision (or `--precision`);
   SliceGPT's runs twice: the first scores the dense model's bfloat16 windows its correction needs and
   keeps them with the baseline, the second (a model's later curves) reuses them;
4. a `prune` at the default precision at `--prune-sparsity` (per mask method).

With `--add-way bfloat16` it resumes the report at `--out` instead: per method swept there, one more
simulation at the default precision with `window_dtype: bfloat16` on the same store (its dense
baseline reused; no dense pass, no sweep), compared with the stored sweep and every-window curve.

Per way: wall seconds, the cost split the jobs record (`timings`), |ln(simulated / swept)| median and
maximum, the windows each point used, and how often each point's 95 % band covers (a) the simulation's
own full-window value - what the band claims - and (b) the swept value. Writes
bench/out/precision_curves-<model>.json (git-ignored) after every job and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
from typing import Any

import harness
from fastapi.testclient import TestClient

from app.main import create_app
from core.prediction.paired_windows import DEFAULT_PRECISION, ESTIMATORS, UNPAIRED, estimate

SPARSITIES = [0.1, 0.2, 0.3, 0.4, 0.5]


def parse_args() -> argparse.Namespace:
    made = harness.parser(__doc__, "precision_curves")
    harness.add_store_args(made, home="required")
    harness.add_model_args(made)
    made.add_argument("--methods", nargs="+", default=["wanda", "magnitude", "slicegpt"])
    made.add_argument("--windows", type=int, default=40)
    made.add_argument("--seqlen", type=int, default=512)
    made.add_argument("--calibration-sequences", type=int, default=32)
    made.add_argument("--prune-sparsity", type=float, default=0.4)
    made.add_argument(
        "--precision",
        type=float,
        default=DEFAULT_PRECISION,
        help="the precision of the 'default precision' way and the prune (a user's other choice)",
    )
    made.add_argument(
        "--window-dtype",
        choices=["float32", "bfloat16"],
        help="`window_dtype` at the default precision (unset: the job's default; the mask methods'"
        " windows run in bfloat16 only when asked)",
    )
    made.add_argument(
        "--prune-only",
        action="store_true",
        help="per method only a prune on every window and one at the default precision (no curves)",
    )
    made.add_argument(
        "--skip-every-window",
        action="store_true",
        help="no simulation on every window (bands then scored against the swept value only; for "
        "magnitude, whose simulation is exact, that is its own full-window value)",
    )
    made.add_argument(
        "--add-way",
        choices=["bfloat16"],
        help="resume --out on --home's store: per method one more curve at the default precision with "
        "this `window_dtype`, against the sweep stored there",
    )
    made.add_argument("--timeout-s", type=float, default=7200.0)
    made.add_argument(
        "--study-only",
        action="store_true",
        help="only the estimator study, on the per-window NLL an earlier run wrote to --out",
    )
    made.set_defaults(out=None)
    args = made.parse_args()
    if args.out is None:
        args.out = harness.OUT_DIR / f"precision_curves-{args.model}.json"
    return args


def common(args: argparse.Namespace, precision: float | None) -> dict[str, Any]:
    return {
        "model": args.model,
        "dtype": "float32",
        "calibration": {"num_sequences": args.calibration_sequences, "seqlen": 512, "batch_size": 8},
        "perplexity": {"seqlen": args.seqlen, "max_windows": args.windows, "precision": precision},
    }


def submit(client: TestClient, body: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    job = harness.submit(client, body, args.timeout_s)
    job["rows"] = [r for r in job["rows"] if r["metric"] == "ppl"]
    return job


def curve(job: dict[str, Any], source: str) -> dict[str, dict[str, Any]]:
    """Per sparsity: value, band, windows used and the job's cost split."""
    points = {}
    for row in job["rows"]:
        if row["source"] != source or row["sparsity"] == 0.0 or row.get("law"):
            continue
        protocol = row["protocol"]
        if (protocol.get("simulation") or {}).get("role", "simulated") != "simulated":
            continue
        sampling = protocol.get("sampling") or {}
        band = protocol.get("band") or sampling
        points[f"{row['sparsity']:g}"] = {
            "value": row["value"],
            "low": band.get("low"),
            "high": band.get("high"),
            "windows": protocol.get("windows"),
            "timings": protocol.get("timings"),
            "window_nll": protocol.get("window_nll"),  # in window order, or that of window_indices
            "window_indices": sampling.get("window_indices"),
            "window_dtype": (protocol.get("simulation") or {}).get("window_dtype"),
            "dense_windows": (protocol.get("simulation") or {}).get("dense_windows"),
        }
    return points


def compare(
    way: dict[str, dict[str, Any]], truth: dict[str, dict[str, Any]], own: dict[str, Any] | None
) -> dict[str, Any]:
    """|ln(way / truth)| and band coverage (of `own`, the same simulation on every window, and of truth)."""
    errors, covered_own, covered_truth = [], [], []
    for at, point in way.items():
        swept = truth[at]["value"]
        errors.append(abs(math.log(point["value"] / swept)))
        if point["low"] is not None and point["windows"] != truth[at]["windows"]:  # every window: no band
            covered_truth.append(point["low"] <= swept <= point["high"])
            if own is not None:
                full = own[at]["value"]
                covered_own.append(point["low"] <= full <= point["high"])
    return {
        "median_log_error": statistics.median(errors),
        "max_log_error": max(errors),
        "windows": [point["windows"] for point in way.values()],
        "bands_cover_full_window_value": f"{sum(covered_own)}/{len(covered_own)}"
        if own is not None
        else None,
        "bands_cover_swept_value": f"{sum(covered_truth)}/{len(covered_truth)}",
    }


def prune_body(args: argparse.Namespace, method: str, precision: float | None) -> dict[str, Any]:
    return {"kind": "prune", "method": method, "sparsity": args.prune_sparsity, **common(args, precision)}


def prune_to_precision(
    client: TestClient, args: argparse.Namespace, method: str, full: float
) -> dict[str, Any]:
    """A measured prune at the default precision against `full`, its value on every window."""
    job = submit(client, prune_body(args, method, args.precision), args)
    [row] = [r for r in job["rows"] if r["method"] != "dense"]
    sampling = row["protocol"]["sampling"]
    return {
        "wall_s": job["wall_s"],
        "value": row["value"],
        "full_window_value": full,
        "windows": sampling["windows"],
        "of_windows": sampling["of_windows"],
        "band": [sampling["low"], sampling["high"]],
        "covers": sampling["low"] <= full <= sampling["high"],
        "log_error": abs(math.log(row["value"] / full)),
    }


def run_curves(
    client: TestClient, args: argparse.Namespace, method: str, entry: dict[str, Any], report: dict[str, Any]
) -> None:
    """The sweep, both simulations and (mask methods) a prune at the default precision."""
    sweep = submit(
        client, {"kind": "sweep", "method": method, "sparsities": SPARSITIES, **common(args, None)}, args
    )
    truth = curve(sweep, "measured")
    entry["sweep"] = {"wall_s": sweep["wall_s"], "curve": truth}
    harness.write_report(args.out, report)
    ways = {}
    ways_asked = [("simulate_every_window", None), ("simulate_default_precision", args.precision)]
    if method == "slicegpt":  # again: its bfloat16 windows' dense values are now kept with the baseline
        ways_asked.append(("simulate_default_precision_again", args.precision))
    for name, precision in ways_asked:
        if precision is None and args.skip_every_window:
            continue
        window_dtype = args.window_dtype if precision is not None else None
        ways[name] = simulate_way(client, args, method, precision, window_dtype, entry, name)
        harness.write_report(args.out, report)
    every_window = ways.get("simulate_every_window")
    if every_window is not None:
        entry["simulate_every_window"] |= compare(every_window, truth, None)
    for name in ways:
        if name != "simulate_every_window":
            entry[name] |= compare(ways[name], truth, every_window)
    if method != "slicegpt":
        entry["prune_default_precision"] = prune_to_precision(
            client, args, method, truth[f"{args.prune_sparsity:g}"]["value"]
        )


def simulate_way(
    client: TestClient,
    args: argparse.Namespace,
    method: str,
    precision: float | None,
    window_dtype: str | None,
    entry: dict[str, Any],
    name: str,
) -> dict[str, dict[str, Any]]:
    """One simulated curve, its wall time against the sweep's, kept in `entry[name]`; its curve."""
    body = {"kind": "simulate", "method": method, "sparsities": SPARSITIES, **common(args, precision)}
    if window_dtype is not None:
        body["window_dtype"] = window_dtype
    job = submit(client, body, args)
    way = curve(job, "simulated")
    entry[name] = {
        "wall_s": job["wall_s"],
        "ratio_to_sweep": round(job["wall_s"] / entry["sweep"]["wall_s"], 3),
        "timings": next(iter(way.values()))["timings"],
        "curve": way,
    }
    return way


def add_way(client: TestClient, args: argparse.Namespace, report: dict[str, Any]) -> None:
    """`--add-way`: per swept method, the default precision with `window_dtype` set, on the same store."""
    name = f"simulate_default_precision_{args.add_way}"
    for method in args.methods:
        entry = report["methods"][method]
        load = list(os.getloadavg())
        way = simulate_way(client, args, method, args.precision, args.add_way, entry, name)
        entry[name]["load_average_start"] = load
        every = (entry.get("simulate_every_window") or {}).get("curve")
        entry[name] |= compare(way, entry["sweep"]["curve"], every)
        harness.write_report(args.out, report)


STUDY_DRAWS = 2000
STUDY_WINDOWS = (8, 16)


def estimator_study(report: dict[str, Any]) -> dict[str, Any]:
    """Each estimator on fixed-size random subsets of every full-window curve point the run stored
    (the swept and the simulated ones): |error| in ln PPL against the full-window value, median and
    95th percentile, and the share of 95 % bands holding it; medians over the points."""
    dense = report["dense_pass"]["window_nll"]
    count = len(dense)
    rows: dict[str, dict[str, float]] = {}
    for method, entry in report["methods"].items():
        points = [
            point["window_nll"]
            for way in ("sweep", "simulate_every_window")
            for point in (entry.get(way) or {}).get("curve", {}).values()
            if point.get("window_nll") and len(point["window_nll"]) == count
        ]
        for windows in STUDY_WINDOWS:
            for name in ESTIMATORS:
                medians, tails, covered = [], [], []
                for values in points:
                    truth = statistics.fmean(values)
                    draws = random.Random(1)
                    errors, held = [], 0
                    for _ in range(STUDY_DRAWS):
                        chosen = draws.sample(range(count), windows)
                        paired = None if name == UNPAIRED else dense
                        found = estimate(chosen, [values[i] for i in chosen], count, paired, estimator=name)
                        errors.append(abs(found.nll_mean - truth))
                        held += errors[-1] <= found.half_log
                    errors.sort()
                    medians.append(statistics.median(errors))
                    tails.append(errors[int(0.95 * len(errors))])
                    covered.append(held / STUDY_DRAWS)
                if points:
                    rows[f"{method} k={windows} {name}"] = {
                        "points": len(points),
                        "median_error": statistics.median(medians),
                        "p95_error": statistics.median(tails),
                        "coverage": statistics.median(covered),
                    }
    return rows


def main() -> None:
    args = parse_args()
    if args.study_only:
        earlier: dict[str, Any] = json.loads(args.out.read_text())
        earlier["estimator_study"] = estimator_study(earlier)
        harness.write_report(args.out, earlier)
        for key, row in earlier["estimator_study"].items():
            print(key, row)
        return
    settings = harness.embedded_store(args)
    if args.add_way:
        resumed: dict[str, Any] = json.loads(args.out.read_text())
        with TestClient(create_app(settings, start_background=False)) as client:
            add_way(client, args, resumed)
        harness.finish_report(args.out, resumed)
        print(summary(resumed))
        return
    report = harness.start_report(
        model=args.model, protocol=common(args, None), default_precision=args.precision, methods={}
    )
    with TestClient(create_app(settings, start_background=False)) as client:
        evaluate = {key: value for key, value in common(args, None).items() if key != "calibration"}
        dense = submit(client, {"kind": "evaluate", **evaluate}, args)
        report["dense_pass"] = {
            "wall_s": dense["wall_s"],
            "ppl": dense["rows"][0]["value"],
            "window_nll": dense["rows"][0]["protocol"]["window_nll"],
        }
        harness.write_report(args.out, report)
        for method in args.methods:
            entry: dict[str, Any] = report["methods"].setdefault(method, {})
            if args.prune_only:
                full = submit(client, prune_body(args, method, None), args)
                [row] = [r for r in full["rows"] if r["method"] != "dense"]
                entry["prune_every_window"] = {"wall_s": full["wall_s"], "value": row["value"]}
                entry["prune_default_precision"] = prune_to_precision(client, args, method, row["value"])
            else:
                run_curves(client, args, method, entry, report)
            harness.write_report(args.out, report)
    report["estimator_study"] = estimator_study(report)
    harness.finish_report(args.out, report)
    print(summary(report))


def summary(report: dict[str, Any]) -> str:
    lines = [f"{report['model']}: dense pass {report['dense_pass']['wall_s']} s"]
    for method, entry in report["methods"].items():
        if "sweep" in entry:
            lines.append(f"{method}: sweep {entry['sweep']['wall_s']} s")
        else:
            lines.append(f"{method}: prune on every window {entry['prune_every_window']}")
        for name, way in entry.items():
            if name.startswith("simulate_") and "median_log_error" in way:  # compared (a run ends so)
                lines.append(
                    f"  {name}: {way['wall_s']} s (x{way['ratio_to_sweep']}), median |ln| "
                    f"{way['median_log_error']:.4f} max {way['max_log_error']:.4f}, "
                    f"windows {way['windows']}, bands cover own {way['bands_cover_full_window_value']} "
                    f"swept {way['bands_cover_swept_value']}"
                )
        prune = entry.get("prune_default_precision")
        if prune:
            lines.append(
                f"  prune at default precision: {prune['windows']} of {prune['of_windows']} windows, "
                f"|ln| {prune['log_error']:.4f}, covers {prune['covers']}, {prune['wall_s']} s"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
