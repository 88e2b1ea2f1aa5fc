"""The `prunecast` command against a live server: exit codes are what CI scripts rely on."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.cli import main
from app.cli_client import EXIT_JOB_FAILED, EXIT_OK, EXIT_USAGE
from core.migrate import upgrade
from tests.app.live_server import free_port, live_server


@pytest.fixture
def server(make_settings: Any) -> Iterator[str]:
    settings = make_settings()  # embedded: SQLite + in-process worker
    upgrade(settings.store_url)
    with live_server(settings) as url:
        yield url


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    code = main(list(argv))
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else None


def test_submit_wait_prints_the_finished_job_with_results(
    server: str, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = {"kind": "evaluate", "model": str(tiny_model_dir), "perplexity": {"seqlen": 64, "max_windows": 2}}
    code, body = run_cli(capsys, "submit", json.dumps(job), "--wait", "--server", server, "--timeout", "120")
    assert code == EXIT_OK
    assert body["status"] == "succeeded" and body["results"][0]["metric"] == "ppl"
    code, waited = run_cli(capsys, "wait", body["id"], "--server", server)
    assert code == EXIT_OK and waited["id"] == body["id"]


def test_failed_job_exits_2(server: str, model_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = model_root / "cli-broken"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text('{"model_type": "llama"}')
    job = {"kind": "evaluate", "model": str(folder)}
    code, body = run_cli(capsys, "submit", json.dumps(job), "--wait", "--server", server, "--timeout", "120")
    assert code == EXIT_JOB_FAILED and body["status"] == "failed" and body["error"]


def test_rejected_job_unreadable_input_and_unreachable_server_exit_3(
    server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, problem = run_cli(capsys, "submit", '{"kind": "teleport"}', "--server", server)
    assert code == EXIT_USAGE and problem["status"] == 422
    assert main(["submit", "{not json", "--server", server]) == EXIT_USAGE
    unreachable = f"http://127.0.0.1:{free_port()}"
    assert main(["submit", '{"kind": "evaluate", "model": "x"}', "--server", unreachable]) == EXIT_USAGE


def test_migrate_command_creates_the_embedded_store(tmp_path: Path) -> None:
    env = {"PRUNECAST_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "migrate"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "prunecast.db").is_file()


def test_worker_without_redis_is_a_usage_error(tmp_path: Path) -> None:
    env = {"PRUNECAST_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "worker"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == EXIT_USAGE and "REDIS_URL" in done.stderr
