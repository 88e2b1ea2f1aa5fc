"""Fault injection in the production shape: the API (uvicorn, reconciler on), real RQ worker
processes, and a PostgreSQL cluster and a Redis server of this module's own, so stopping them
never touches the suite's shared services.

What must hold: a store outage costs a running job nothing (not even an attempt), requests during
it are 503 problems on a connection that stays usable, a worker that dies is replaced by a retry,
and a canceled job leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from core.migrate import upgrade
from core.settings import Settings
from tests.app.live_server import live_server
from tests.app.test_jobs_api import evaluate_body
from tests.conftest import WorkerProcess, wait_for

pytestmark = [
    pytest.mark.skipif(shutil.which("pg_createcluster") is None, reason="needs pg_createcluster"),
    pytest.mark.services,  # its own PostgreSQL and Redis instances
]

LONG_RUN = {"max_windows": 800, "seqlen": 16}  # ~5-30 s of tiny windows: caught mid-run
OUTLIVING_RUN = {"max_windows": 2400, "seqlen": 16}  # runs on past an outage of OUTAGE_S
OUTAGE_S = 5.0  # longer than the heartbeat timeout below


UNMEASURED_PREDICTION = {"model": "never-measured", "method": "slicegpt", "sparsities": [0.2]}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class OwnPostgres:
    """A PostgreSQL cluster of this module's own (root can create one), stoppable at will."""

    version: str
    name: str
    port: int

    def ctl(self, action: str, *extra: str) -> None:
        subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", self.version, self.name, action, *extra],
            check=True,
            capture_output=True,
            timeout=60,
        )

    def stop(self) -> None:
        self.ctl("stop", "-m", "immediate")

    def start(self) -> None:
        self.ctl("start")

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[OwnPostgres]:
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    cluster = OwnPostgres(version, f"prunecast_faults_{uuid.uuid4().hex[:8]}", free_port())
    subprocess.run(
        ["pg_createcluster", version, cluster.name, "-p", str(cluster.port), "--", "--auth=trust"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    try:
        cluster.start()
        yield cluster
    finally:
        subprocess.run(["pg_dropcluster", "--stop", version, cluster.name], capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        cwd=tmp_path_factory.mktemp("redis"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"redis://127.0.0.1:{port}/0"
        wait_for(lambda: _redis_answers(port), 20, "the module's own Redis to start")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=20)


def _redis_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@pytest.fixture
def fault_settings(
    own_postgres: OwnPostgres, own_redis: str, make_settings: Callable[..., Settings]
) -> Iterator[Settings]:
    """A fresh database on the module's cluster, the module's Redis, fast heartbeats."""
    name = f"faults_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(own_postgres.admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = f"postgresql+psycopg://postgres@127.0.0.1:{own_postgres.port}/{name}"
    upgrade(url)
    yield make_settings(database_url=url, redis_url=own_redis, store_retry_s=60.0, store_retry_after_s=2)
    with (
        contextlib.suppress(psycopg.Error),
        psycopg.connect(own_postgres.admin_url, autocommit=True) as admin,
    ):
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def production(fault_settings: Settings, tmp_path: Path) -> Iterator[tuple[str, Callable[[], WorkerProcess]]]:
    """The API served by uvicorn (reconciler on) and a way to start worker processes."""
    workers: list[WorkerProcess] = []

    def start_worker() -> WorkerProcess:
        worker = WorkerProcess(fault_settings, tmp_path / f"worker-{len(workers)}.log")
        workers.append(worker)
        return worker

    with live_server(fault_settings, keep_alive_s=120) as base_url:
        yield base_url, start_worker
    for worker in workers:
        worker.stop()


class Connection:
    """One keep-alive HTTP connection: every request goes over the same socket, or fails."""

    def __init__(self, base_url: str) -> None:
        host, port = base_url.removeprefix("http://").split(":")
        self.http = http.client.HTTPConnection(host, int(port), timeout=30)
        self.socket: socket.socket | None = None

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, dict[str, str], Any]:
        payload = None if body is None else json.dumps(body)
        headers = {"Content-Type": "application/json"} if body is not None else {}
        self.http.request(method, path, body=payload, headers=headers)
        if self.socket is None:
            self.socket = self.http.sock
        assert self.http.sock is self.socket, "the server closed the keep-alive connection"
        response = self.http.getresponse()
        raw = response.read()
        found = {key.lower(): value for key, value in response.getheaders()}
        assert found.get("connection", "").lower() != "close", (path, found)
        text = raw.decode()
        is_json = found.get("content-type", "").endswith("json")
        return response.status, found, json.loads(text) if is_json else text

    def close(self) -> None:
        self.http.close()


def job_of(base_url: str, job_id: str) -> dict[str, Any]:
    connection = Connection(base_url)
    try:
        status, _, body = connection.request("GET", f"/v1/jobs/{job_id}")
    finally:
        connection.close()
    assert status == 200, body
    job: dict[str, Any] = body
    return job


def wait_terminal(base_url: str, job_id: str, timeout: float) -> dict[str, Any]:
    return wait_for(
        lambda: (job := job_of(base_url, job_id))["status"] in ("succeeded", "failed", "canceled") and job,
        timeout,
        f"job {job_id} to finish",
        interval=0.2,
    )


def test_a_store_outage_costs_a_running_job_nothing_and_requests_get_503_on_a_live_connection(
    production: tuple[str, Callable[[], WorkerProcess]],
    own_postgres: OwnPostgres,
    fault_settings: Settings,
    tiny_model_dir: Path,
) -> None:
    base_url, start_worker = production
    assert fault_settings.heartbeat_timeout_s < OUTAGE_S  # the reconciler's grace is what saves the job
    worker = start_worker()
    connection = Connection(base_url)
    status, _, job = connection.request(
        "POST", "/v1/jobs", evaluate_body(str(tiny_model_dir), **OUTLIVING_RUN)
    )
    assert status == 202, job
    wait_for(lambda: job_of(base_url, job["id"])["stage"] == "perplexity", 120, "the job to be scoring")

    own_postgres.stop()
    stopped = time.monotonic()
    try:
        for method, path, body in (
            ("GET", f"/v1/jobs/{job['id']}", None),
            ("GET", "/v1/results?metric=ppl", None),
            ("POST", "/v1/jobs", evaluate_body(str(tiny_model_dir))),
            ("POST", "/v1/predictions", UNMEASURED_PREDICTION),  # its state read is awaited on the loop
            ("GET", "/metrics", None),
            ("GET", "/readyz", None),
        ):
            status, headers, problem = connection.request(method, path, body)
            assert status == 503, (path, problem)
            assert headers["content-type"].startswith("application/problem+json") and headers["retry-after"]
            assert problem["status"] == 503
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - stopped)))
    finally:
        own_postgres.start()

    status, _, during = connection.request("GET", f"/v1/jobs/{job['id']}")  # the same socket still works
    assert status == 200 and during["status"] in ("running", "succeeded"), during
    status, _, problem = connection.request("POST", "/v1/predictions", UNMEASURED_PREDICTION)
    assert status == 409, problem  # read past the restarted store: no baseline for this model
    done = wait_terminal(base_url, job["id"], 300)
    assert done["status"] == "succeeded", (done, worker.output()[-3000:])
    assert done["attempts"] == 1 and done["error"] is None, done  # never presumed dead, never retried
    status, _, jobs = connection.request("GET", "/v1/jobs")
    assert [item["id"] for item in jobs["items"]] == [job["id"]]  # the 503'd submission stored nothing
    connection.close()


def test_a_worker_killed_mid_job_is_retried_and_the_retry_completes(
    production: tuple[str, Callable[[], WorkerProcess]], tiny_model_dir: Path
) -> None:
    base_url, start_worker = production
    worker = start_worker()
    connection = Connection(base_url)
    _, _, job = connection.request("POST", "/v1/jobs", evaluate_body(str(tiny_model_dir), **LONG_RUN))
    connection.close()
    running = wait_for(
        lambda: (state := job_of(base_url, job["id"]))["stage"] == "perplexity" and state,
        120,
        "the job to run",
    )
    horse_pid = int(running["worker"].rsplit(":", 1)[1])  # RQ's work horse runs in its own group
    worker.kill(signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.kill(horse_pid, signal.SIGKILL)
    requeued = wait_for(
        lambda: (state := job_of(base_url, job["id"]))["status"] == "queued" and state,
        30,
        "the dead job to be requeued",
    )
    assert "lost its worker" in requeued["error"] and requeued["attempts"] == 1
    start_worker()
    done = wait_terminal(base_url, job["id"], 300)
    assert done["status"] == "succeeded" and done["attempts"] == 2, done
    assert done["error"] is None  # the retry's success clears what the lost attempt said


def test_a_canceled_prune_job_leaves_no_row_and_no_file(
    production: tuple[str, Callable[[], WorkerProcess]], fault_settings: Settings, tiny_model_dir: Path
) -> None:
    base_url, start_worker = production
    start_worker()
    body = {
        "kind": "prune",
        "model": str(tiny_model_dir),
        "method": "wanda",
        "sparsity": 0.5,
        "calibration": {"num_sequences": 4, "seqlen": 32, "batch_size": 2},
        "perplexity": LONG_RUN,
    }
    connection = Connection(base_url)
    _, _, job = connection.request("POST", "/v1/jobs", body)
    # Past the dense baseline and the saved model: the job has stored rows and files by now.
    wait_for(
        lambda: job_of(base_url, job["id"])["stage"] == "perplexity", 180, "the pruned model to be scored"
    )
    status, _, stored = connection.request("GET", f"/v1/jobs/{job['id']}/results")
    assert status == 200 and [r["method"] for r in stored["items"]] == ["dense"]
    assert (fault_settings.artifacts_dir / job["id"]).is_dir()
    status, _, _ = connection.request("DELETE", f"/v1/jobs/{job['id']}")
    assert status == 202
    done = wait_terminal(base_url, job["id"], 120)
    assert done["status"] == "canceled"
    for path in (f"/v1/jobs/{job['id']}/results", f"/v1/jobs/{job['id']}/artifacts", "/v1/results"):
        status, _, listed = connection.request("GET", path)
        assert status == 200 and listed["items"] == [], (path, listed)
    assert not (fault_settings.artifacts_dir / job["id"]).exists()
    connection.close()
