"""The `prunecast` command: run the service (serve, worker, migrate) or talk to one (submit, wait,
predict).

Exit codes of the client commands, for CI:
  0  ok (and every gate passed)
  1  a gate failed: --max-ppl or --max-acc-drop (a gate with nothing to check fails too)
  2  the job failed or was canceled (submit --wait, wait)
  3  usage or connection error, or the server refused the request (4xx, e.g. a 409 for an
     unknown dense baseline; the problem is printed)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from core.methods import DEFAULT_METHOD, DENSE
from core.tasks import ACCURACY_METRICS, SCORE_METRICS

EXIT_OK = 0
EXIT_GATE_FAILED = 1
EXIT_JOB_FAILED = 2
EXIT_USAGE = 3

DEFAULT_SERVER = "http://127.0.0.1:8000"


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app.main import create_app
    from core.settings import get_settings

    settings = get_settings()
    uvicorn.run(create_app(settings), host=args.host, port=args.port, log_config=None, access_log=False)
    return EXIT_OK


def _worker(args: argparse.Namespace) -> int:
    """`prunecast worker ...` belongs to the engine side; it is reached by name (core.entrypoints),
    so this client never imports torch."""
    from core.entrypoints import WORKER_COMMAND, resolve

    code: int = resolve(WORKER_COMMAND)(args.worker_args)
    return code


def _migrate(_: argparse.Namespace) -> int:
    from core.migrate import upgrade
    from core.settings import get_settings

    settings = get_settings()
    upgrade(settings.store_url)
    print(f"store at {settings.store_url.split('@')[-1]} is at the newest schema")
    return EXIT_OK


def _import_published(_: argparse.Namespace) -> int:
    from core.published import import_published
    from core.settings import get_settings
    from core.store import Store

    store = Store(get_settings().store_url)
    try:
        with store.session() as session:
            added = import_published(session)
    finally:
        store.dispose()
    for label in added:
        print(f"imported {label}")
    print("every published curve is in the store" if not added else f"{len(added)} curve(s) imported")
    return EXIT_OK


def _client(args: argparse.Namespace) -> Any:
    import httpx

    headers = {"Accept": "application/json"}
    token = os.environ.get("PRUNECAST_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.Client(base_url=args.server, headers=headers, timeout=httpx.Timeout(30.0, read=None))


def _print(body: Any) -> None:
    print(json.dumps(body, indent=2, sort_keys=True))


def _wait_until_done(client: Any, job_id: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        remaining = max(1.0, deadline - time.monotonic())
        response = client.get(f"/v1/jobs/{job_id}/wait", params={"timeout": min(remaining, 300.0)})
        response.raise_for_status()
        job: dict[str, Any] = response.json()
        if job["status"] in ("succeeded", "failed", "canceled") or time.monotonic() >= deadline:
            return job


def _job_exit_code(job: dict[str, Any]) -> int:
    return EXIT_OK if job["status"] == "succeeded" else EXIT_JOB_FAILED


def _gate_report(failures: list[str], checked: list[str]) -> dict[str, Any]:
    for line in failures:
        print(f"gate failed: {line}", file=sys.stderr)
    return {"passed": not failures, "failures": failures, "checked": checked}


def _result_gates(client: Any, results: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """--max-ppl / --max-acc-drop on a finished job's measured results: its pruned results, or all
    of them when it pruned nothing. Accuracy drops are against the model's dense result of the same
    metric and task (from the job, else the newest in the store)."""
    scope = [r for r in results if r["method"] != DENSE] or results
    failures: list[str] = []
    checked: list[str] = []
    if args.max_ppl is not None:
        ppl = [r for r in scope if r["metric"] == "ppl"]
        if not ppl:
            failures.append(f"--max-ppl {args.max_ppl:g}: the job measured no perplexity")
        for r in ppl:
            line = f"ppl of {r['method']} at s = {r['sparsity']:g} is {r['value']:.4g}"
            (failures if r["value"] > args.max_ppl else checked).append(f"{line} (max {args.max_ppl:g})")
    if args.max_acc_drop is not None:
        accuracy = [r for r in scope if r["metric"] in SCORE_METRICS and r["method"] != DENSE]
        if not accuracy:
            failures.append(f"--max-acc-drop {args.max_acc_drop:g}: the job measured no pruned accuracy")
        for r in accuracy:
            dense = _dense_result(client, results, r)
            what = f"{r['metric']} on {r['dataset']} at s = {r['sparsity']:g}"
            if dense is None:
                failures.append(f"{what}: no dense {r['metric']} of {r['model']} to compare with")
                continue
            drop = dense["value"] - r["value"]
            line = f"{what} drops {drop:.4f} (dense {dense['value']:.4f} -> {r['value']:.4f})"
            (failures if drop > args.max_acc_drop else checked).append(f"{line} (max {args.max_acc_drop:g})")
    return _gate_report(failures, checked)


def _dense_result(
    client: Any, results: list[dict[str, Any]], pruned: dict[str, Any]
) -> dict[str, Any] | None:
    for r in results:
        if r["method"] == DENSE and (r["metric"], r["dataset"]) == (pruned["metric"], pruned["dataset"]):
            return r
    params = {"model": pruned["model"], "method": DENSE, "metric": pruned["metric"]}
    response = client.get("/v1/results", params={**params, "dataset": pruned["dataset"], "limit": 1})
    response.raise_for_status()
    items: list[dict[str, Any]] = response.json()["items"]
    return items[0] if items else None


def _read_job(args: argparse.Namespace) -> dict[str, Any]:
    """The job JSON from the argument or --file; ValueError says what is wrong."""
    if args.file:
        text = Path(args.file).read_text()
    elif args.body:
        text = args.body
    else:
        raise ValueError("give the job as JSON text or with --file")
    body: dict[str, Any] = json.loads(text)
    return body


def _submit(args: argparse.Namespace) -> int:
    import httpx

    gated = args.max_ppl is not None or args.max_acc_drop is not None
    if gated and not args.wait:
        print("--max-ppl and --max-acc-drop need --wait", file=sys.stderr)
        return EXIT_USAGE
    try:
        body = _read_job(args)
    except (OSError, ValueError) as error:
        print(f"cannot read the job: {error}", file=sys.stderr)
        return EXIT_USAGE
    try:
        with _client(args) as client:
            headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else {}
            response = client.post("/v1/jobs", json=body, headers=headers)
            if response.status_code >= 400:
                _print(response.json())
                return EXIT_USAGE
            job = response.json()
            if not args.wait:
                _print(job)
                return EXIT_OK
            return _wait_and_gate(client, job["id"], args, gated)
    except (httpx.HTTPError, OSError) as error:
        print(f"cannot reach {args.server}: {error}", file=sys.stderr)
        return EXIT_USAGE


def _wait_and_gate(client: Any, job_id: str, args: argparse.Namespace, gated: bool) -> int:
    """Wait for the job, print it with its results (and gates), and say how it went as an exit code."""
    job = _wait_until_done(client, job_id, args.timeout)
    if job["status"] == "succeeded":
        job["results"] = client.get(f"/v1/jobs/{job_id}/results").json()["items"]
        if gated:
            job["gates"] = _result_gates(client, job["results"], args)
    _print(job)
    if job["status"] != "succeeded":
        return EXIT_JOB_FAILED
    return EXIT_GATE_FAILED if gated and not job["gates"]["passed"] else EXIT_OK


def _wait(args: argparse.Namespace) -> int:
    import httpx

    try:
        with _client(args) as client:
            job = _wait_until_done(client, args.job_id, args.timeout)
            _print(job)
            return _job_exit_code(job)
    except (httpx.HTTPError, OSError) as error:
        print(f"cannot reach {args.server}: {error}", file=sys.stderr)
        return EXIT_USAGE


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


def _add_gates(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-ppl", type=float, default=None, help="gate: exit 1 when a perplexity exceeds this"
    )
    parser.add_argument(
        "--max-acc-drop",
        type=float,
        default=None,
        help="gate: exit 1 when an accuracy falls more than this below the dense one (a fraction: 0.05)",
    )


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on a usage error, but 2 means a failed job here: usage errors exit 3."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="prunecast", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the API (and, without REDIS_URL, the worker too)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.set_defaults(run=_serve)

    worker = commands.add_parser(
        "worker",
        help="run an RQ worker (needs REDIS_URL; `prunecast worker --help` for its options)",
        add_help=False,
    )
    worker.add_argument("worker_args", nargs=argparse.REMAINDER, help="--burst, --name NAME, --no-preload")
    worker.set_defaults(run=_worker)

    migrate = commands.add_parser("migrate", help="bring the store's schema up to date")
    migrate.set_defaults(run=_migrate)

    published = commands.add_parser(
        "import-published",
        help="store the published pruning curves (core/published.py) as `source: published` results",
    )
    published.set_defaults(run=_import_published)

    for name, handler, helptext in (
        ("submit", _submit, "submit a job (JSON) to a server"),
        ("wait", _wait, "wait for a job to finish"),
    ):
        client = commands.add_parser(name, help=helptext)
        client.add_argument("--server", default=os.environ.get("PRUNECAST_SERVER", DEFAULT_SERVER))
        client.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait at most")
        client.set_defaults(run=handler)
        if name == "submit":
            client.add_argument("body", nargs="?", help='job JSON, e.g. \'{"kind": "evaluate", ...}\'')
            client.add_argument("--file", help="read the job JSON from this file")
            client.add_argument("--wait", action="store_true", help="block until the job ends")
            client.add_argument("--idempotency-key", default=None)
            _add_gates(client)
        else:
            client.add_argument("job_id")

    predict = commands.add_parser(
        "predict",
        help="predict perplexity / accuracy at sparsities (POST /v1/predictions), with CI gates",
        description="Answer from the best rung that can: measured, simulated, profile, law (each with "
        "its band and verdict; --measure-missing queues the jobs that would do better). Exit 0 ok, "
        "1 a gate failed, 3 usage/connection error or a refused request (e.g. 409: the dense baseline "
        "is unknown; the problem names the job that measures it).",
    )
    predict.add_argument("--server", default=os.environ.get("PRUNECAST_SERVER", DEFAULT_SERVER))
    predict.add_argument("--model", required=True, help="model id as stored in results")
    predict.add_argument("--method", default=DEFAULT_METHOD)
    predict.add_argument(
        "--sparsity", type=float, action="append", required=True, help="fraction removed; repeat for more"
    )
    predict.add_argument(
        "--metric", action="append", choices=("ppl", *ACCURACY_METRICS), help="default ppl; repeatable"
    )
    predict.add_argument("--task", action="append", help="task of accuracy metrics, e.g. arc_easy")
    predict.add_argument("--seqlen", type=int, default=None, help="perplexity protocol: window length")
    predict.add_argument("--max-windows", default=None, help="perplexity protocol: a number or `all`")
    predict.add_argument("--points", default=None, help="JSON file with your measured points")
    predict.add_argument(
        "--calibration",
        default=None,
        help='the calibration the prune will use, JSON or @file: {"corpus", "num_sequences", "seqlen", '
        '"seed"}; picks the profile, and the calibration --measure-missing jobs draw',
    )
    predict.add_argument(
        "--precision",
        default=None,
        help="relative 95%% band half width the queued simulation scores to (default 0.02; `all`: every "
        "window)",
    )
    predict.add_argument("--json", action="store_true", help="print the response (and gates) as JSON")
    predict.add_argument(
        "--rung",
        default="best",
        choices=("best", "measured", "simulated", "profile", "law", "strict"),
        help="answer from this rung only (default: the best that can answer)",
    )
    predict.add_argument(
        "--measure-missing", action="store_true", help="queue the jobs that would give a better answer"
    )
    predict.add_argument(
        "--band", action="store_true", help="gate on the band's far end instead of the value"
    )
    _add_gates(predict)
    predict.set_defaults(run=_predict)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:  # its options are the worker's own parser's (workers.cli)
        return _worker(argparse.Namespace(worker_args=argv[1:]))
    args = build_parser().parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
