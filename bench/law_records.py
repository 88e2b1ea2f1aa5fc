"""The law rung's records on the measured curves of both models, before and after issue 32 (no model
is run: the curves are the ones this file's tables record, each with where bench/README.md measured it).

Usage (from the repository root; pure Python, a few seconds):

    .venv/bin/python bench/law_records.py

Each record holds out measured points and scores the answer a user got for them by |ln(pred / meas)|,
pooled model -> curve -> point (`core.prediction.records`), with the coverage of the stated 95 % band:

- **zero points of the model** (a new model): before, the strict law PPL0 ** (1 / (1 - s)), which was
  the answer with no point; after, alpha pooled over the *other* model's curves of the method
  (`core.prediction.priors`, leave-one-model-out), with no band from one other model;
- **one point** (every measured point in turn predicts the curve's others): the one-point alpha law,
  its value unchanged; before, its band from the 3 % prior (`band_from_prior`); after, sd = tau |s -
  s_point| with tau from the one-point record of the *other* model's curves of the method (what a
  store holding only the other model would state; `records.distance_rate`), no band where that
  record is too short;
- **leave-one-sparsity-out** (the calibrated law fitted on a curve's other points): before, the raw
  law; after, `Calibration.predict`, which answers ln PPL interpolated from the dense value short of
  an affine law's first fitted point.

Nothing here was fitted to these curves: the laws' forms, the 3 % prior, the verdict thresholds and
the band rules were fixed before this file existed. The profile and simulated rungs are not scored
here: the profile rung needs each curve's profile (hours of CPU on this machine), and the simulated
rung's record is `bench/simulate_curves.py`'s.

Writes bench/out/law_records.json (git-ignored; `--out` for another file) and prints the table
bench/README.md quotes.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import harness

from core.prediction import priors, records
from core.prediction.backtests import HeldOut as Miss
from core.prediction.bands import lognormal_band
from core.prediction.laws import calibrate_ppl, strict_ppl

LEVEL = 0.95
SMOL, GEMMA = "smollm2-135m", "gemma-3-270m"


@dataclass(frozen=True)
class MeasuredCurve:
    model: str
    method: str
    label: str  # protocol and where bench/README.md records it
    ppl0: float
    points: tuple[tuple[float, float], ...]


WT2_512_40 = "WikiText-2 seqlen 512, 40 windows"
CURVES = (
    # bench/README.md, sweep_smollm2.py (4 windows of 512; calibration 32 x 256 BoolQ, seed 42)
    MeasuredCurve(SMOL, "slicegpt", "4 windows of 512, BoolQ 32 x 256", 30.70,
                  ((0.1, 64.01), (0.2, 118.38), (0.3, 191.45), (0.4, 354.09))),
    # bench/README.md, predict_smollm2.py: three calibrations of one protocol
    MeasuredCurve(SMOL, "slicegpt", f"{WT2_512_40}, BoolQ 128 x 512 seed 42", 29.01,
                  ((0.1, 64.43), (0.2, 118.98), (0.3, 210.79), (0.4, 356.10), (0.5, 616.79))),
    MeasuredCurve(SMOL, "slicegpt", f"{WT2_512_40}, LAMBADA 128 x 512 seed 42", 29.01,
                  ((0.1, 123.03), (0.2, 455.72), (0.3, 1147.14), (0.4, 2249.64), (0.5, 4192.76))),
    MeasuredCurve(SMOL, "slicegpt", f"{WT2_512_40}, BoolQ 32 x 512 seed 7", 29.01,
                  ((0.1, 64.80), (0.2, 132.18), (0.3, 216.48), (0.4, 346.20), (0.5, 597.95))),
    # issue 31 / bench/first_contact.py: WikiText-2 seqlen 1024, 30 windows; BoolQ 64 x 1024 seed 7
    MeasuredCurve(SMOL, "slicegpt", "WikiText-2 seqlen 1024, 30 windows, BoolQ 64 x 1024 seed 7", 24.0565,
                  ((0.15, 71.30), (0.25, 137.05), (0.35, 257.91), (0.45, 444.43))),
    # bench/README.md, slicing Gemma-3 (2026-12-03)
    MeasuredCurve(GEMMA, "slicegpt", f"{WT2_512_40}, BoolQ 128 x 512 seed 42", 62.18,
                  ((0.1, 178.73), (0.2, 439.05), (0.3, 803.15), (0.4, 1144.47), (0.5, 1520.67))),
    # bench/README.md, first_contact.py on Gemma (WikiText-2 seqlen 512, 16 windows; BoolQ 32 x 512 seed 7)
    MeasuredCurve(GEMMA, "slicegpt", "WikiText-2 seqlen 512, 16 windows, BoolQ 32 x 512 seed 7", 70.98,
                  ((0.15, 342.9), (0.25, 850.6), (0.35, 1303.3), (0.45, 1778.3))),
    # bench/README.md, Wanda (2026-12-02)
    MeasuredCurve(SMOL, "wanda", f"{WT2_512_40}, BoolQ 128 x 512 seed 42", 29.01,
                  ((0.2, 29.97), (0.3, 33.13), (0.4, 42.08), (0.5, 63.78), (0.6, 153.91))),
    MeasuredCurve(GEMMA, "wanda", f"{WT2_512_40}, BoolQ 128 x 512 seed 42", 62.18,
                  ((0.2, 66.03), (0.3, 66.31), (0.4, 88.36), (0.5, 150.62), (0.6, 323.68))),
    # bench/README.md, SparseGPT and magnitude (2026-12-02)
    MeasuredCurve(SMOL, "sparsegpt", f"{WT2_512_40}, BoolQ 128 x 512 seed 42", 29.01,
                  ((0.2, 29.86), (0.3, 32.99), (0.4, 39.47), (0.5, 57.40), (0.6, 104.25))),
    MeasuredCurve(GEMMA, "sparsegpt", f"{WT2_512_40}, BoolQ 128 x 512 seed 42", 62.18,
                  ((0.2, 64.28), (0.3, 70.78), (0.4, 88.52), (0.5, 131.7), (0.6, 227.2))),
    MeasuredCurve(SMOL, "magnitude", f"{WT2_512_40}, no calibration", 29.01,
                  ((0.1, 28.64), (0.2, 31.91), (0.3, 45.17), (0.4, 100.1), (0.5, 507.5))),
    MeasuredCurve(GEMMA, "magnitude", f"{WT2_512_40}, no calibration", 62.18,
                  ((0.1, 67.99), (0.2, 99.85), (0.3, 259.7), (0.4, 1733.0), (0.5, 17552.0))),
)  # fmt: skip


Record = Callable[[MeasuredCurve, Sequence[MeasuredCurve]], list[Miss]]


def strict(curve: MeasuredCurve, others: Sequence[MeasuredCurve]) -> list[Miss]:
    return [
        Miss(curve.model, curve.label, s, v, strict_ppl(curve.ppl0, s), None, "nothing")
        for s, v in curve.points
    ]


def pooled_alpha(curve: MeasuredCurve, others: Sequence[MeasuredCurve]) -> list[Miss]:
    other_models = [
        priors.CurvePoints(c.model, c.label, c.ppl0, c.points) for c in others if c.model != curve.model
    ]
    prior = priors.pooled_alpha(other_models)
    if prior is None:
        return []
    return [
        Miss(curve.model, curve.label, s, v, *priors.predict(curve.ppl0, prior, s, LEVEL), prior.source)
        for s, v in curve.points
    ]


def one_point_before(curve: MeasuredCurve, others: Sequence[MeasuredCurve]) -> list[Miss]:
    misses = []
    for s0, v0 in curve.points:
        calibration = calibrate_ppl(curve.ppl0, [(s0, v0)])
        for s, v in curve.points:
            if s != s0:
                p = calibration.predict(s, LEVEL)
                misses.append(
                    Miss(curve.model, curve.label, s, v, p.value, p.band, f"s = {s0:g}", abs(s - s0))
                )
    return misses


def one_point_after(curve: MeasuredCurve, others: Sequence[MeasuredCurve]) -> list[Miss]:
    other_record = [m for c in others if c.model != curve.model for m in one_point_before(c, others)]
    tau = records.distance_rate(other_record)
    return [
        replace(
            m,
            band=None
            if tau is None
            else lognormal_band(m.predicted, tau * (m.distance or 0.0), LEVEL, floor=curve.ppl0),
        )
        for m in one_point_before(curve, others)
    ]


def _leave_one_out(curve: MeasuredCurve, answer: Callable[[Any, float], float]) -> list[Miss]:
    misses = []
    for i, (s, v) in enumerate(curve.points):
        training = [p for j, p in enumerate(curve.points) if j != i]
        calibration = calibrate_ppl(curve.ppl0, training)
        misses.append(Miss(curve.model, curve.label, s, v, answer(calibration, s), None, "the other points"))
    return misses


def loso_before(curve: MeasuredCurve, others: Sequence[MeasuredCurve]) -> list[Miss]:
    return _leave_one_out(curve, lambda calibration, s: calibration.chosen.predict(s, LEVEL).value)


def loso_after(curve: MeasuredCurve, others: Sequence[MeasuredCurve]) -> list[Miss]:
    return _leave_one_out(curve, lambda calibration, s: calibration.predict(s, LEVEL).value)


MODES: tuple[tuple[str, Record, Record], ...] = (
    ("zero points (strict law -> alpha pooled over the other model)", strict, pooled_alpha),
    ("one point (3 % prior band -> tau |s - s0| band)", one_point_before, one_point_after),
    ("leave-one-sparsity-out (raw law -> from dense short of the first point)", loso_before, loso_after),
)


def summary(misses: Sequence[Miss]) -> dict[str, Any]:
    numbers = records.summarize(misses, [m.covered for m in misses])
    finite = [m.log_error for m in misses if math.isfinite(m.log_error)]
    per_model = {
        model: records.summarize([m for m in misses if m.model == model]).factor
        for model in sorted({m.model for m in misses})
    }
    return {
        "points": numbers.points,
        "curves": numbers.curves,
        "models": numbers.models,
        "typical_factor": numbers.factor,
        "worst_factor": None if numbers.worst is None else math.exp(min(numbers.worst, 700.0)),
        "coverage": numbers.coverage,
        "median_factor": math.exp(statistics.median(finite)) if finite else None,
        "diverged": len(misses) - len(finite),  # the law has no finite value there (alpha s >= 1)
        "banded_points": sum(m.band is not None for m in misses),
        "factor_by_model": per_model,
        "verdict_new_model": records.verdict(numbers, new_model=True).level,
        "verdict_known_model": records.verdict(numbers, new_model=False).level,
    }


def run() -> dict[str, Any]:
    out: dict[str, Any] = {"level": LEVEL, "curves": [c.__dict__ for c in CURVES], "methods": {}}
    for method in sorted({c.method for c in CURVES}):
        curves = [c for c in CURVES if c.method == method]
        out["methods"][method] = {
            mode: {
                "before": summary([m for c in curves for m in before(c, curves)]),
                "after": summary([m for c in curves for m in after(c, curves)]),
            }
            for mode, before, after in MODES
        }
    return out


def _cell(numbers: dict[str, Any]) -> str:
    if not numbers["points"]:
        return "no point"
    coverage = numbers["coverage"]
    banded = "no band" if coverage is None else f"bands cover {coverage:.0%} of {numbers['banded_points']}"
    diverged = f", {numbers['diverged']} diverged" if numbers["diverged"] else ""
    return (
        f"x{numbers['typical_factor']:.3g} (median x{numbers['median_factor']:.3g}, worst "
        f"x{numbers['worst_factor']:.3g}{diverged}); {banded}"
    )


def main() -> None:
    args = harness.parser(__doc__, "law_records", threads=None).parse_args()
    out = run()
    harness.finish_report(args.out, harness.start_report(with_torch=False, **out))
    print("| method | record | points (curves, models) | before | after |")
    print("|---|---|---|---|---|")
    for method, modes in out["methods"].items():
        for mode, pair in modes.items():
            after = pair["after"]
            counts = f"{after['points']} ({after['curves']}, {after['models']})"
            print(f"| {method} | {mode} | {counts} | {_cell(pair['before'])} | {_cell(after)} |")


if __name__ == "__main__":
    main()
