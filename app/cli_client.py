"""What every client command of `prunecast` shares (`app.cli`, `app.cli_predict`): the exit codes CI
reads, the HTTP client to the server (bearer token from PRUNECAST_TOKEN), printing a body, and the
report of the gates a command checked.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

EXIT_OK = 0


EXIT_GATE_FAILED = 1


EXIT_JOB_FAILED = 2


EXIT_USAGE = 3


DEFAULT_SERVER = "http://127.0.0.1:8000"


def _client(args: argparse.Namespace) -> Any:
    import httpx

    headers = {"Accept": "application/json"}
    token = os.environ.get("PRUNECAST_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.Client(base_url=args.server, headers=headers, timeout=httpx.Timeout(30.0, read=None))


def _print(body: Any) -> None:
    print(json.dumps(body, indent=2, sort_keys=True))


def _gate_report(failures: list[str], checked: list[str]) -> dict[str, Any]:
    for line in failures:
        print(f"gate failed: {line}", file=sys.stderr)
    return {"passed": not failures, "failures": failures, "checked": checked}
