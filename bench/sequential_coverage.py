"""How often a curve's bands to a precision hold their full-window value, over many seeded orders
(issue 41): the simulate job's own window procedure replayed on per-window NLL a run already stored.

One run of `precision_curves.py` scores each point in one seeded order, so its 4 bands say little
about coverage. This bench takes what that run stored on every window (the dense pass and the
simulation on every window: each point's 40 per-window NLL) and replays the procedure of
`workers.kinds.simulate_windows.refine_points` with the same core functions, the windows' values
read from the record instead of a model: the first `FIRST_WINDOWS` of an order are the pilot every
point scored, `choose_reference` picks the reference (scored on every window) or the dense pairing,
and every other point adds windows until its band reaches the precision. Per rule and order: each
point's band against its own full-window value, and the windows it took. Torch-free, seconds.

Rules (`RULES`): `sequential` is the job's; `two_stage` takes the windows its pilot projects
(`windows_needed`, Stein's two-stage idea: the sample size is fixed by the pilot's spread, so the
stop does not wait for a spread that came out small by chance) and bands on all of them; `first_16`
is the job's rule with no look at the band before 16 windows.

    .venv/bin/python bench/sequential_coverage.py --runs bench/out/precision_curves-smollm2-135m.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import harness

from core.prediction.curve_pairing import choose_reference
from core.prediction.paired_windows import (
    DEFAULT_PRECISION,
    FIRST_WINDOWS,
    WindowEstimate,
    estimate,
    estimate_sequentially,
    window_order,
    windows_needed,
)

Values = Sequence[float]
Rule = Callable[[Values, Sequence[int], float, Values], WindowEstimate]


def sequential(values: Values, order: Sequence[int], precision: float, covariate: Values) -> WindowEstimate:
    """The job's rule: windows in `order`, a few at a time, until the band reaches `precision`."""
    return estimate_sequentially(lambda indices: [values[i] for i in indices], order, precision, covariate)


def two_stage(values: Values, order: Sequence[int], precision: float, covariate: Values) -> WindowEstimate:
    """As many windows as the pilot projects for `precision`, then one band on all of them."""
    pilot = list(order[:FIRST_WINDOWS])
    count = windows_needed([values[i] for i in pilot], [covariate[i] for i in pilot], len(order), precision)
    taken = list(order[:count])
    return estimate(taken, [values[i] for i in taken], len(order), covariate)


def first_16(values: Values, order: Sequence[int], precision: float, covariate: Values) -> WindowEstimate:
    """The job's rule with no look at the band before 16 windows."""
    score = lambda indices: [values[i] for i in indices]  # noqa: E731
    return estimate_sequentially(score, order, precision, covariate, first=16)


RULES: dict[str, Rule] = {"sequential": sequential, "two_stage": two_stage, "first_16": first_16}


def replay(
    curve: dict[float, Values], dense: Values, order: Sequence[int], precision: float, rule: Rule
) -> tuple[float | None, dict[float, WindowEstimate]]:
    """Every face value of `curve` (per-window NLL by sparsity) in `order`, as `refine_points` does."""
    pilot = list(order[:FIRST_WINDOWS])
    reference = choose_reference(
        {s: [v[i] for i in pilot] for s, v in curve.items()}, [dense[i] for i in pilot], len(order), precision
    )
    covariate = dense if reference is None else curve[reference]
    found = {}
    for sparsity, values in curve.items():
        if sparsity == reference:
            found[sparsity] = estimate(list(order), [values[i] for i in order], len(order), None)
        else:
            found[sparsity] = rule(values, order, precision, covariate)
    return reference, found


def study(
    curve: dict[float, Values], dense: Values, swept: dict[float, float], precision: float, orders: int
) -> dict[str, Any]:
    """Per rule over `orders` seeded orders: coverage of the full-window value (non-reference points),
    per point and pooled, the same for the swept value (`swept`: PPL by sparsity, the method itself),
    and the windows the curve took on average."""
    rows: dict[str, Any] = {}
    for name, rule in RULES.items():
        held: dict[float, int] = dict.fromkeys(curve, 0)
        held_swept = 0
        banded: dict[float, int] = dict.fromkeys(curve, 0)
        windows = []
        references = every_window = 0
        for seed in range(orders):
            order = window_order(len(dense), seed)
            reference, found = replay(curve, dense, order, precision, rule)
            windows.append(sum(estimated.windows for estimated in found.values()))
            references += reference is not None
            for sparsity, estimated in found.items():
                if estimated.complete:  # the full-window value itself: no band to score
                    every_window += sparsity != reference
                    continue
                truth = statistics.fmean(curve[sparsity])
                banded[sparsity] += 1
                held[sparsity] += abs(estimated.nll_mean - truth) <= estimated.half_log
                held_swept += abs(estimated.nll_mean - math.log(swept[sparsity])) <= estimated.half_log
        total = sum(banded.values())
        rows[name] = {
            "coverage": sum(held.values()) / total if total else None,
            "coverage_by_point": {f"{s:g}": held[s] / banded[s] for s in curve if banded[s]},
            "coverage_of_swept": held_swept / total if total else None,
            "mean_windows": statistics.fmean(windows),
            "orders_with_reference": references,
            "other_points_on_every_window": every_window,
        }
    return rows


def curves_of(run: dict[str, Any]) -> dict[str, tuple[dict[float, Values], Values, dict[float, float]]]:
    """Each method's simulated curve on every window, the dense windows and the swept PPL by sparsity,
    from a precision run."""
    dense = run["dense_pass"]["window_nll"]
    found = {}
    for method, entry in run["methods"].items():
        points = (entry.get("simulate_every_window") or {}).get("curve", {})
        curve = {
            float(at): p["window_nll"] for at, p in points.items() if len(p["window_nll"] or ()) == len(dense)
        }
        swept = {float(at): p["value"] for at, p in entry["sweep"]["curve"].items()}
        if curve:
            found[method] = (curve, dense, swept)
    return found


def main() -> None:
    made = harness.parser(__doc__, "sequential_coverage", threads=None)
    made.add_argument("--runs", type=Path, nargs="+", required=True, help="precision_curves.py reports")
    made.add_argument("--precision", type=float, nargs="+", default=[DEFAULT_PRECISION])
    made.add_argument("--orders", type=int, default=1000)
    args: argparse.Namespace = made.parse_args()
    report = harness.start_report(with_torch=False, orders=args.orders, results={})
    for path in args.runs:
        run = json.loads(path.read_text())
        for method, (curve, dense, swept) in curves_of(run).items():
            for precision in args.precision:
                key = f"{run['model']} {method} precision={precision:g}"
                report["results"][key] = study(curve, dense, swept, precision, args.orders)
                print(key, report["results"][key])
                harness.write_report(args.out, report)
    harness.finish_report(args.out, report)


if __name__ == "__main__":
    main()
