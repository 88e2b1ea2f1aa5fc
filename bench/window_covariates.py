"""Which per-window covariate pairs a simulated point best: the dense windows, or a reference point's.

Usage (from the repository root; Gemma needs its packaged wheels, see README.md):

    HF_HUB_OFFLINE=1 .venv/bin/python bench/window_covariates.py --models smollm2-135m gemma-3-270m
    HF_HUB_OFFLINE=1 .venv/bin/python bench/window_covariates.py --study-only   # again, from the JSON

The paired estimator (`core.prediction.paired_windows`) takes every window's dense NLL as its control
variate. Slicing's damage differs so much from window to window that the dense windows explain
little of it (a band of about ±20 % from 8 of 40 windows), while a point's windows follow another
point's of the same curve closely. So a curve could score one reference point on every window and
pair the others with it. This measures both ways on the same data: per model (fp32, CPU,
`--threads`), the dense model's per-window NLL on the first `--windows` WikiText-2 test windows of
512, and the simulated curve of each `--methods` at s = 0.1..0.5 scored on every window
(calibration `--calibration` BoolQ passages x 512, seed 42; SliceGPT per-layer with the job's default
three quarters of them as basis windows). Then, for every point and `--draws` seeded random
subsets of k windows, |ln PPL estimated - ln PPL over every window| (median and 95th percentile) and
how often the 95 % band held the every-window value, for the covariates:

- `dense`: the dense windows (what the jobs do today);
- `reference`: the windows of the reference point (`--reference`, scored on every window; its own
  error is zero and it is left out of the pooled numbers);
- `nearest`: the windows of the nearest other point, as if that one were the reference.

And the curve scored to `--precision` as a job scores it, over `--orders` seeded window orders, three
ways: every point paired with the dense windows; the middle point on every window and the others
paired with it; and as the job's rule chooses between the two from each order's pilot
(`core.prediction.curve_pairing`): the windows the curve used, the errors and the coverage.

Writes bench/out/window_covariates.json (git-ignored) after every step and prints the study.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import harness

SEQLEN = 512
SPARSITIES = [0.1, 0.2, 0.3, 0.4, 0.5]


def collect(name: str, args: argparse.Namespace, settings: Any, record: dict[str, Any], save: Any) -> None:
    """Every window's NLL: the dense model's, then each method's simulated points."""
    from workers.evaluation.perplexity import window_nll_sums
    from workers.simulation import SIMULATED, SimulationOptions, simulate_curve

    loaded = harness.load_dense(name, settings)
    ids = harness.wikitext_ids(loaded, settings)
    windows = ids[: args.windows * SEQLEN].view(args.windows, SEQLEN)
    if "dense" not in record:
        started = time.perf_counter()
        sums = window_nll_sums(loaded.model, windows)
        record["dense"] = [float(s) / (SEQLEN - 1) for s in sums]
        record["dense_s"] = time.perf_counter() - started
        save()
    batch = harness.calibration_batch(loaded.tokenizer, settings, args.calibration, SEQLEN, 42)
    basis = 3 * args.calibration // 4  # the simulate job's default share of sequential basis windows
    for method in args.methods:
        if method in record.get("methods", {}):
            continue
        started = time.perf_counter()
        report = simulate_curve(
            loaded.model,
            method,
            windows,
            SPARSITIES,
            calibration_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            options=SimulationOptions(basis_windows=basis if method == "slicegpt" else None),
        )
        points = {str(p.sparsity): list(p.scores.per_window) for p in report.points if p.role == SIMULATED}
        record.setdefault("methods", {})[method] = {"points": points, "wall_s": time.perf_counter() - started}
        print(name, method, f"{time.perf_counter() - started:.1f}s", flush=True)
        save()


def score(truth: list[float], covariate: list[float], ks: list[int], draws: int, seed: int) -> dict[str, Any]:
    """Error and coverage of the regression estimator paired with `covariate`, k windows at a time."""
    from core.prediction.paired_windows import estimate

    population = len(truth)
    full = statistics.fmean(truth)
    rng = random.Random(seed)
    found: dict[str, Any] = {}
    for k in ks:
        errors, held, halves = [], 0, []
        for _ in range(draws):
            chosen = rng.sample(range(population), k)
            got = estimate(chosen, [truth[i] for i in chosen], population, covariate)
            errors.append(abs(got.nll_mean - full))
            held += abs(got.nll_mean - full) <= got.half_log
            halves.append(got.relative_half_width)
        errors.sort()
        found[str(k)] = {
            "median": statistics.median(errors),
            "p95": errors[int(0.95 * len(errors)) - 1],
            "coverage": held / draws,
            "median_relative_half_width": statistics.median(halves),
        }
    return found


def to_precision(
    points: dict[float, list[float]], dense: list[float], way: str, orders: int, precision: float
) -> dict[str, Any]:
    """A curve scored to `precision` as a job scores it (`estimate_sequentially`, one seeded order per
    curve shared by its points, a pilot of FIRST_WINDOWS), over `orders` orders, its points paired
    `way`: `dense` (every point with the dense windows), `reference` (the middle point on every
    window, the others with it) or `chosen` (the job's rule, `core.prediction.curve_pairing`, from
    each order's pilot). The windows the curve used, how often the rule chose the reference, and
    each point's error and coverage against its every-window value."""
    from core.prediction.curve_pairing import choose_reference, middle_point
    from core.prediction.paired_windows import FIRST_WINDOWS, estimate_sequentially, window_order

    population = len(dense)
    used, errors, held, count, chosen = [], [], 0, 0, 0
    for seed in range(orders):
        order = window_order(population, seed)
        pilot = order[:FIRST_WINDOWS]
        reference = {
            "dense": None,
            "reference": middle_point(list(points)),
            "chosen": choose_reference(
                {s: [nll[i] for i in pilot] for s, nll in points.items()},
                [dense[i] for i in pilot],
                population,
                precision,
            ),
        }[way]
        chosen += reference is not None
        total = population if reference is not None else 0
        for s, truth in points.items():
            if s == reference:
                continue
            covariate = dense if reference is None else points[reference]
            got = estimate_sequentially(_scorer(truth), order, precision, covariate)
            full = statistics.fmean(truth)
            total += got.windows
            errors.append(abs(got.nll_mean - full))
            held += got.complete or abs(got.nll_mean - full) <= got.half_log
            count += 1
        used.append(total)
    return {
        "windows_per_curve": statistics.fmean(used),
        "of_windows": population * len(points),
        "reference_chosen": chosen / orders,
        "median_error": statistics.median(errors),
        "max_error": max(errors),
        "coverage": held / count,
    }


def study(out: dict[str, Any], args: argparse.Namespace) -> None:
    ks = args.subsets
    for name, record in out["models"].items():
        dense = record.get("dense")
        for method, data in record.get("methods", {}).items():
            points = {float(s): v for s, v in data["points"].items()}
            reference = args.reference
            rows: dict[str, Any] = {}
            for s, truth in points.items():
                nearest = min((o for o in points if o != s), key=lambda o: (abs(o - s), o))
                row = {
                    "dense": score(truth, dense, ks, args.draws, 1),
                    "nearest": score(truth, points[nearest], ks, args.draws, 1),
                    "nearest_is": nearest,
                    "corr_dense": _corr([a - b for a, b in zip(truth, dense, strict=True)], dense),
                }
                if s != reference:
                    row["reference"] = score(truth, points[reference], ks, args.draws, 1)
                rows[str(s)] = row
            data["study"] = rows
            data["to_precision"] = {
                way: to_precision(points, dense, way, args.orders, args.precision)
                for way in ("dense", "reference", "chosen")
            }
            for way, found in data["to_precision"].items():
                print(
                    f"{name} {method} to precision {args.precision} paired with {way}:",
                    f"{found['windows_per_curve']:.1f} of {found['of_windows']} windows",
                    f"(reference in {100 * found['reference_chosen']:.0f} % of orders),",
                    f"median error {found['median_error']:.4f}, max {found['max_error']:.4f},",
                    f"coverage {found['coverage']:.3f}",
                    flush=True,
                )
            for k in ks:
                line = [f"{name} {method} k={k}:"]
                for way in ("dense", "reference", "nearest"):
                    cells = [r[way][str(k)] for r in rows.values() if way in r]
                    line.append(
                        f"{way} median {statistics.median(c['median'] for c in cells):.4f}"
                        f" p95 {statistics.median(c['p95'] for c in cells):.4f}"
                        f" cover {statistics.median(c['coverage'] for c in cells):.3f}"
                        f" band {statistics.median(c['median_relative_half_width'] for c in cells):.3f}"
                    )
                print(" | ".join(line), flush=True)


def _scorer(window_nll: list[float]) -> Callable[[Sequence[int]], list[float]]:
    """A window scorer that looks the already measured windows up."""
    return lambda chosen: [window_nll[i] for i in chosen]


def _corr(a: list[float], b: list[float]) -> float:
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    num = sum((x - ma) * (y - mb) for x, y in zip(a, b, strict=True))
    den = math.sqrt(sum((x - ma) ** 2 for x in a) * sum((y - mb) ** 2 for y in b))
    return num / den if den else 0.0


def main() -> None:
    made = harness.parser(__doc__, "window_covariates")
    harness.add_models_args(made, models=("smollm2-135m",))
    made.add_argument("--methods", nargs="+", default=["slicegpt", "wanda", "magnitude"])
    made.add_argument("--calibration", type=int, default=32)
    made.add_argument("--windows", type=int, default=40)
    made.add_argument("--subsets", type=int, nargs="+", default=[8, 12, 16])
    made.add_argument("--draws", type=int, default=2000)
    made.add_argument("--reference", type=float, default=0.3)
    made.add_argument("--orders", type=int, default=200, help="seeded window orders for --precision")
    made.add_argument("--precision", type=float, default=0.02)
    made.add_argument("--study-only", action="store_true", help="rerun the study on the JSON at --out")
    args, settings = harness.parse_engine(made)
    if args.study_only:
        out = json.loads(args.out.read_text())
    else:
        out = harness.start_report(protocol=harness.simulation_protocol(args, SEQLEN), models={})

        def save() -> None:
            harness.write_report(args.out, out)

        for name in args.models:
            collect(name, args, settings, out["models"].setdefault(name, {}), save)
    study(out, args)
    harness.finish_report(args.out, out)


if __name__ == "__main__":
    main()
