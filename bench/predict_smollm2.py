"""Predicting before pruning, measured: profiles of SmolLM2-135M (or any packaged model), their
cost, and every predictor's backtest against the measured sweeps of one method in the same store.

Usage (from the repository root; the sweeps first, into one store, then this):

    HF_HUB_OFFLINE=1 .venv/bin/python bench/sweep_smollm2.py --home bench/out/store \\
        --sparsities 0 0.1 0.2 0.3 0.4 0.5 --calibration-sequences 128 --calibration-length 512 \\
        --eval-windows 40 [--calibration-corpus lambada-passages]
    HF_HUB_OFFLINE=1 .venv/bin/python bench/predict_smollm2.py --home bench/out/store

With `--method wanda` (or sparsegpt, magnitude, magnitude-row) the backtests and the prediction are
that method's, predicted from the profiles' mask errors; sweep it first (`sweep_smollm2.py --method`),
on each `--model` to be compared (e.g. `gemma-3-270m`), and profile each model
with this script (`--skip-cost`); the last run's backtests cover every model in the store, and
`--cost-steps dense profile wanda` measures the profile against a Wanda prune instead of slicing.

Steps, each the way a user's request runs (the app behind a TestClient, the embedded worker):

1. a `profile` job per calibration corpus, with the sweeps' calibration (128 x 512, seed 42,
   batch 8) and sparsities 0.1..0.5; with `--measured-on boolq-passages`, each profile measures
   what its basis discards on 32 other windows of that corpus (seed 1234), not on its own windows;
2. cost, side by side in fresh subprocesses one after another on the same windows: one plain
   dense forward (the yardstick), the profile engine, and SliceGPT at s = 0.25; wall time and the
   subprocess's peak RSS (VmHWM), and the profile engine's own split (`engine_s`); with
   `--measured-on`, the profile also runs the measured windows, as its jobs do, and the dense
   step times a second pass over them (`wall_same_windows_s`: the calibration and the measured
   windows, every window the profile reads);
3. `GET /v1/backtests?points=true` over the store, and `POST /v1/predictions` for the model, whose
   `before_pruning` is what a user sees.

Writes `bench/out/predict_smollm2.json`: the profile jobs, `cost` (per step wall_s, peak_rss_mb, and
the ratios profile / dense pass and profile / slicing), `backtests` (the endpoint's answer, every
held-out point included), `headline` (per predictor and sparsity on each curve: zero points, and
one point at s = 0.2) and `prediction` (the endpoint's answer for the first curve's model).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import harness

CALIBRATION = {"num_sequences": 128, "seqlen": 512, "batch_size": 8}
SPARSITIES = [0.1, 0.2, 0.3, 0.4, 0.5]
ANCHOR = 0.2
COST_STEPS = ["dense", "profile", "profile-without-masks", "slice", "wanda"]


def parse_args() -> argparse.Namespace:
    parser = harness.parser(__doc__, "predict_smollm2")
    harness.add_store_args(parser, home="required")
    harness.add_model_args(parser)
    parser.add_argument("--method", default="slicegpt", help="whose sweeps are backtested and predicted")
    parser.add_argument("--sparsities", type=float, nargs="+", default=SPARSITIES, help="profiled")
    parser.add_argument("--anchor", type=float, default=ANCHOR, help="the one-point headline's point")
    parser.add_argument(
        "--cost-steps",
        nargs="+",
        default=["dense", "profile", "slice"],
        choices=COST_STEPS,
    )
    parser.add_argument("--corpora", nargs="+", default=["boolq-passages", "lambada-passages"])
    parser.add_argument("--lens-tokens", type=int, default=256)
    parser.add_argument(
        "--measured-on",
        default=None,
        help="measure every profile's discard on windows of this corpus (default: its calibration windows)",
    )
    parser.add_argument("--measured-sequences", type=int, default=32)
    parser.add_argument("--calibration-sequences", type=int, default=CALIBRATION["num_sequences"])
    parser.add_argument("--calibration-seed", type=int, default=None, help="default: the job's seed, 42")
    parser.add_argument("--measured-seed", type=int, default=1234)
    parser.add_argument("--skip-profiles", action="store_true", help="reuse the profiles in the store")
    parser.add_argument("--skip-cost", action="store_true")
    parser.add_argument("--cost-step", choices=COST_STEPS, help=argparse.SUPPRESS)
    return parser.parse_args()


# ------------------------------------------------------------------------------------------ cost


def cost_step(args: argparse.Namespace) -> None:
    """One cost step in this (fresh) process; prints one JSON line."""
    import torch

    from core.model_sources import resolve_model
    from core.profiles import MASK_RULES
    from workers.calibration import build_calibration, calibration_corpus
    from workers.loading import load_model
    from workers.profiling import profile_model
    from workers.pruning.engine import prune_model
    from workers.slicing.engine import slice_model

    harness.use_threads(args.threads)
    settings = harness.settings_for(args)
    loaded = load_model(resolve_model(args.model, settings), settings, dtype="auto", device="cpu")
    corpus = calibration_corpus(args.corpora[0], None, settings)
    batch = build_calibration(
        loaded.tokenizer,
        corpus,
        num_sequences=CALIBRATION["num_sequences"],
        seqlen=CALIBRATION["seqlen"],
        seed=42,
    )
    ids, size = batch.input_ids, CALIBRATION["batch_size"]
    measured = None  # as a profile job measures on other windows (the cost of drawing them aside)
    if args.measured_on is not None:
        measured = build_calibration(
            loaded.tokenizer,
            calibration_corpus(args.measured_on, None, settings),
            num_sequences=args.measured_sequences,
            seqlen=CALIBRATION["seqlen"],
            seed=args.measured_seed,
        ).input_ids
    started = time.perf_counter()
    laps: list[float] = []  # the dense step: after the calibration windows, after the measured ones
    with torch.no_grad():
        if args.cost_step == "dense":
            for windows in [ids] if measured is None else [ids, measured]:
                for start in range(0, windows.shape[0], size):
                    loaded.model(input_ids=windows[start : start + size], use_cache=False)
                laps.append(time.perf_counter() - started)
        elif args.cost_step.startswith("profile"):
            rules = () if args.cost_step == "profile-without-masks" else MASK_RULES
            report = profile_model(
                loaded.model,
                ids,
                None,
                args.sparsities,
                batch_size=size,
                lens_tokens=args.lens_tokens,
                mask_rules=rules,
                measured_ids=measured,
            )
        elif args.cost_step == "wanda":
            prune_model(loaded.model, "wanda", 0.5, calibration_ids=ids, batch_size=size)
        else:
            slice_model(loaded.model, ids, None, 0.25, batch_size=size, keep_bases=False)
    wall = laps[0] if laps else time.perf_counter() - started
    line = {"step": args.cost_step, "wall_s": round(wall, 2), "peak_rss_mb": peak_rss_mb()}
    if len(laps) > 1:
        line["wall_same_windows_s"] = round(laps[-1], 2)
    if args.cost_step.startswith("profile"):  # where the profile's time went
        line["engine_s"] = {
            key: round(sum(value) if isinstance(value, list) else float(value), 2)
            for key, value in report.timings.items()
        }
    print(json.dumps(line))


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def measure_cost(args: argparse.Namespace) -> dict[str, Any]:
    steps = {}
    for step in args.cost_steps:
        command = [
            sys.executable,
            __file__,
            "--home",
            str(args.home),
            "--cost-step",
            step,
            "--model",
            args.model,
        ]
        command += ["--sparsities", *map(str, args.sparsities)]
        command += ["--cache-dir", str(args.cache_dir), "--data-dir", str(args.data_dir)]
        if args.measured_on is not None:
            command += [
                "--measured-on",
                args.measured_on,
                "--measured-sequences",
                str(args.measured_sequences),
            ]
            command += ["--measured-seed", str(args.measured_seed)]
        command += [
            "--threads",
            str(args.threads),
            "--lens-tokens",
            str(args.lens_tokens),
            "--corpora",
            args.corpora[0],
        ]
        print(f"cost: {step} ...", flush=True)
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        steps[step] = json.loads(output.strip().splitlines()[-1])
        print(f"cost: {steps[step]}", flush=True)
    ratios: dict[str, Any] = {"steps": steps}
    if "profile" in steps:
        for other in sorted(steps.keys() - {"profile"}):
            name = ("slicing" if other == "slice" else other).replace("-", "_")
            for key, label in (("wall_s", "wall"), ("peak_rss_mb", "peak_rss")):
                ratios[f"profile_over_{name}_{label}"] = round(steps["profile"][key] / steps[other][key], 3)
    if "wall_same_windows_s" in steps.get("dense", {}) and "profile" in steps:
        ratios["profile_over_dense_same_windows_wall"] = round(
            steps["profile"]["wall_s"] / steps["dense"]["wall_same_windows_s"], 3
        )
    return ratios


# -------------------------------------------------------------------------------------- profiles


def run_profile(client: Any, body: dict[str, Any]) -> dict[str, Any]:
    print(f"profile on {body['calibration']['corpus']}", flush=True)
    job = harness.submit(client, body, math.inf)
    return {"job_id": job["id"], "wall_s": job["wall_s"]}


def taylor_tracking(client: Any, model: str, corpus: str) -> dict[str, Any]:
    """Over every (signal, width) of the stored profile: Pearson of the Taylor estimate against the
    exact lens KL, and their mean ratio; plus the discarded shares at each width, per signal kind."""
    profile = client.get(f"/v1/models/{model}/profile", params={"corpus": corpus}).json()
    pairs = [(r["kl"], r["kl_taylor"]) for s in profile["signals"] for r in s["lens"]]
    if len(pairs) < 2:
        return {"pairs": len(pairs)}
    xs, ys = [a for a, _ in pairs], [b for _, b in pairs]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    cov = sum((x - mx) * (y - my) for x, y in pairs)
    pearson = cov / (sum((x - mx) ** 2 for x in xs) * sum((y - my) ** 2 for y in ys)) ** 0.5
    shares = {
        kind: {
            str(width): round(max(s["discarded"][i] for s in profile["signals"] if s["kind"] == kind), 5)
            for i, width in enumerate(profile["widths"])
        }
        for kind in ("embedding", "pre-mlp", "output")
    }
    return {
        "profile_id": profile["id"],
        "pairs": len(pairs),
        "pearson": round(pearson, 4),
        "mean_taylor_over_exact": round(sum(y / x for x, y in pairs if x > 0) / len(pairs), 4),
        "largest_raw_share_discarded_by_kind": shares,
        "engine_timings_s": profile["protocol"].get("engine_timings_s"),
    }


ZERO_POINT_MODES = (
    "zero-points, leave-one-curve-out",
    "zero-points, leave-one-model-out",
    "zero-points, other methods of the model",
)


def headline(backtests: dict[str, Any], anchor: float = ANCHOR) -> list[dict[str, Any]]:
    """Per predictor, curve and sparsity: the zero-point and the one-point (s = anchor) errors."""
    rows = []
    for item in backtests["items"]:
        for point in item["points"] or []:
            if item["mode"] == "one-point" and not point["fitted_on"].startswith(f"s = {anchor:g}"):
                continue
            if item["mode"] not in ("one-point", *ZERO_POINT_MODES):
                continue
            rows.append(
                {
                    "predictor": item["predictor"],
                    "mode": item["mode"],
                    "curve": point["curve"],
                    "sparsity": point["sparsity"],
                    "measured": round(point["measured"], 3),
                    "predicted": _rounded(point["predicted"], 3),  # null: the law overflows there
                    "ape": _rounded(point["ape"], 4),
                    "covered": point["covered"],
                    "band": None if point["band"] is None else [_rounded(v, 2) for v in point["band"]],
                }
            )
    return rows


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _mean_ape(group: list[dict[str, Any]]) -> float:
    apes = [r["ape"] if r["ape"] is not None else float("inf") for r in group]
    return round(sum(apes) / len(apes), 4)


def summarise(rows: list[dict[str, Any]], anchor: float = ANCHOR) -> list[dict[str, Any]]:
    """MAPE per predictor, mode and curve over the headline rows."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["predictor"], row["mode"], row["curve"]), []).append(row)
    out = []
    for (predictor, mode, curve), group in sorted(groups.items()):
        covered = [r["covered"] for r in group if r["covered"] is not None]
        out.append(
            {
                "predictor": predictor,
                "mode": mode if mode != "one-point" else f"one-point (s = {anchor:g})",
                "curve": curve,
                "n": len(group),
                "mape": _mean_ape(group),
                "max_ape": max((r["ape"] if r["ape"] is not None else float("inf")) for r in group),
                "coverage": None if not covered else round(sum(covered) / len(covered), 3),
            }
        )
    return out


def main() -> None:
    args = parse_args()
    if args.cost_step:
        cost_step(args)
        return
    from fastapi.testclient import TestClient

    from app.main import create_app

    report = harness.start_report(
        calibration=CALIBRATION, sparsities=args.sparsities, model=args.model, method=args.method
    )
    settings = harness.embedded_store(args)
    with TestClient(create_app(settings, start_background=False)) as client:
        if not args.skip_profiles:
            report["profiles"] = {
                corpus: run_profile(
                    client,
                    {
                        "kind": "profile",
                        "model": args.model,
                        "calibration": {
                            **CALIBRATION,
                            "corpus": corpus,
                            "num_sequences": args.calibration_sequences,
                            "seed": args.calibration_seed,
                        },
                        "sparsities": args.sparsities,
                        "lens_tokens": args.lens_tokens,
                        "measured_on": None
                        if args.measured_on is None
                        else {
                            "corpus": args.measured_on,
                            "num_sequences": args.measured_sequences,
                            "seqlen": CALIBRATION["seqlen"],
                            "batch_size": CALIBRATION["batch_size"],
                            "seed": args.measured_seed,
                        },
                    },
                )
                for corpus in args.corpora
            }
        report["lens_taylor_tracking"] = {
            corpus: taylor_tracking(client, args.model, corpus) for corpus in args.corpora
        }
        backtests = client.get("/v1/backtests", params={"points": True, "method": args.method}).json()
        report["backtests"] = backtests
        report["headline"] = headline(backtests, args.anchor)
        report["headline_summary"] = summarise(report["headline"], args.anchor)
        model = backtests["curves"][0]["model"] if backtests["curves"] else args.model
        answer = client.post(
            "/v1/predictions", json={"model": model, "method": args.method, "sparsities": args.sparsities}
        )
        report["prediction"] = answer.json()
    if not args.skip_cost:
        report["cost"] = measure_cost(args)
    harness.finish_report(args.out, report)
    for row in report["headline_summary"]:
        print(json.dumps(row))
    print(json.dumps(report.get("cost", {})))


if __name__ == "__main__":
    main()
