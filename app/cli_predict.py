"""`prunecast predict`: the question as a `POST /v1/predictions` body (with the job that
`--measure-missing` queues), the answer as a table, and the gates CI checks on the answer itself,
whichever rung gave it (README, "Predictions").
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from app.cli_client import EXIT_GATE_FAILED, EXIT_OK, EXIT_USAGE, _client, _gate_report, _print
from core.tasks import ACCURACY_METRICS


def _predict_body(args: argparse.Namespace) -> dict[str, Any]:
    """The POST /v1/predictions body the flags describe; ValueError names a bad combination."""
    tasks = args.task or []
    metric_names = list(dict.fromkeys(args.metric or ["ppl"]))
    if args.max_acc_drop is not None and not any(m in ACCURACY_METRICS for m in metric_names):
        metric_names.append("acc")
    if args.max_ppl is not None and "ppl" not in metric_names:
        metric_names.append("ppl")
    metrics: list[dict[str, Any]] = []
    for name in metric_names:
        if name == "ppl":
            metrics.append({"metric": "ppl"})
        elif not tasks:
            raise ValueError(f"--metric {name} needs --task (e.g. --task arc_easy)")
        else:
            metrics.extend({"metric": name, "task": task} for task in tasks)
    body: dict[str, Any] = {
        "model": args.model,
        "method": args.method,
        "sparsities": args.sparsity,
        "metrics": metrics,
    }
    windows = args.max_windows
    if windows is not None and windows != "all":
        if not windows.isdigit():
            raise ValueError(f"--max-windows takes a number or `all`, got {windows!r}")
        windows = int(windows)
    protocol = {"seqlen": args.seqlen, "max_windows": windows}
    if any(value is not None for value in protocol.values()):
        body["protocol"] = {key: value for key, value in protocol.items() if value is not None}
    if args.points:
        body["points"] = json.loads(Path(args.points).read_text())
    return body | _queued_job_options(args) | _answer_options(args)


def _queued_job_options(args: argparse.Namespace) -> dict[str, Any]:
    """--calibration and --precision: what the jobs --measure-missing queues draw and score to."""
    options: dict[str, Any] = {}
    if args.calibration is not None:
        options["calibration"] = _json_object(args.calibration, "--calibration")
    if args.precision is not None:
        options["precision"] = None if args.precision == "all" else float(args.precision)
    return options


def _json_object(text: str, flag: str) -> dict[str, Any]:
    """A flag's JSON object, inline or from a file (`@path`); ValueError saying which flag."""
    source = Path(text[1:]).read_text() if text.startswith("@") else text
    try:
        value = json.loads(source)
    except json.JSONDecodeError as error:
        raise ValueError(f"{flag} takes a JSON object (or @file): {error}") from error
    if not isinstance(value, dict):
        raise ValueError(f"{flag} takes a JSON object, got {type(value).__name__}")
    return value


def _answer_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if getattr(args, "rung", "best") != "best":
        options["rung"] = args.rung
    if getattr(args, "measure_missing", False):
        options["measure_missing"] = True
    return options


def _prediction_gates(answer: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """--max-ppl / --max-acc-drop on every requested sparsity. The value checked is the response's
    answer `value`, from the best rung that can give it (the line names the rung and its verdict); a
    sparsity no rung can answer fails the gate, and so does an answer whose band reaches past the
    limit when --band is given."""
    failures: list[str] = []
    checked: list[str] = []
    for metric in answer["metrics"]:
        is_ppl = metric["metric"] == "ppl"
        limit = args.max_ppl if is_ppl else args.max_acc_drop
        if limit is None:
            continue
        what = "ppl" if is_ppl else f"{metric['metric']} on {metric['task']}"
        for p in metric["predictions"]:
            verdict = (p.get("verdict") or {}).get("level", "unscored")
            where = f"{what} at s = {p['sparsity']:g} ({p.get('rung') or 'no rung'}, {verdict})"
            if p["value"] is None:
                failures.append(f"{where}: no answer")
                continue
            worst = p["value"]
            if getattr(args, "band", False) and p["band"]:
                worst = (p["band"][1] if is_ppl else p["band"][0]) or math.inf
            if is_ppl:
                line, bad = f"{where} is {worst:.4g} (max {limit:g})", worst > limit
            else:
                drop = metric["baseline"]["value"] - worst
                line, bad = f"{where} drops {drop:.4f} (max {limit:g})", drop > limit
            (failures if bad else checked).append(line)
    return _gate_report(failures, checked)


def _print_prediction_table(answer: dict[str, Any]) -> None:
    header = ("metric", "task", "sparsity", "value", "band", "rung", "verdict", "strict", "flags")
    rows = [header]
    for metric in answer["metrics"]:
        for p in metric["predictions"]:
            band = p["band"]
            rows.append(
                (
                    metric["metric"],
                    metric["task"] or "-",
                    f"{p['sparsity']:g}",
                    _fmt(p["value"]),
                    f"[{_fmt(band[0])}, {_fmt(band[1])}]" if band else "-",
                    p.get("rung") or "-",
                    (p.get("verdict") or {}).get("level", "-"),
                    _fmt(p["strict"]),
                    ",".join(p["flags"]) or "-",
                )
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    for metric in answer["metrics"]:
        what = metric["metric"] if metric["task"] is None else f"{metric['metric']} on {metric['task']}"
        base = metric["baseline"]
        print(f"\n{what}: dense {base['value']:.4g}; protocol {metric['protocol']['selection']}")
        if metric["fitted_on"]:
            fitted = ", ".join(f"{p['sparsity']:g}: {p['value']:.4g}" for p in metric["fitted_on"])
            print(f"  fitted on {fitted}")
        from_a_law = any(p.get("rung") in ("law", "strict") for p in metric["predictions"])
        if metric["strict_law"] and from_a_law:  # beside a measured or simulated answer it misleads
            print(f"  {metric['strict_law']['verdict']}")
        verdicts = {
            (p["rung"], p["verdict"]["advice"])
            for p in metric["predictions"]
            if p.get("verdict") and p["rung"]
        }
        for rung, advice in sorted(verdicts):
            print(f"  {rung}: {advice}")
        for job in metric.get("missing") or []:
            queued = any(q["kind"] == job["kind"] for q in metric.get("queued") or [])
            print(f"  {'queued' if queued else 'missing'}: a {job['kind']} job would give {job['gives']}")


def _fmt(value: float | None) -> str:
    return "null" if value is None else f"{value:.4g}"


def _predict(args: argparse.Namespace) -> int:
    import httpx

    try:
        body = _predict_body(args)
    except (OSError, ValueError) as error:
        print(f"prunecast predict: {error}", file=sys.stderr)
        return EXIT_USAGE
    try:
        with _client(args) as client:
            response = client.post("/v1/predictions", json=body)
    except (httpx.HTTPError, OSError) as error:
        print(f"cannot reach {args.server}: {error}", file=sys.stderr)
        return EXIT_USAGE
    if response.status_code != 200:
        try:
            _print(response.json())
        except ValueError:
            print(response.text, file=sys.stderr)
        return EXIT_USAGE
    answer: dict[str, Any] = response.json()
    gates = _prediction_gates(answer, args)
    if args.json:
        _print({**answer, "gates": gates})
    else:
        _print_prediction_table(answer)
        for line in gates["checked"]:
            print(f"gate ok: {line}")
    return EXIT_OK if gates["passed"] else EXIT_GATE_FAILED
