"""Shared fixtures: a scratch Postgres database and Redis db per test run, tiny models, servers.

Tests talk to the real PostgreSQL and Redis on 127.0.0.1; each run creates its own database and
picks an empty Redis db, and removes both when it ends.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import text

from app.main import create_app
from core import store_generation
from core.migrate import upgrade
from core.settings import Settings
from core.store import Store
from core.tables import Base

REPO_ROOT = Path(__file__).resolve().parents[1]
PG_ADMIN_URL = os.environ.get("PRUNECAST_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_BASE_URL = os.environ.get("PRUNECAST_TEST_REDIS", "redis://127.0.0.1:6379")
SERVICE_FIXTURES = frozenset({"pg_url", "redis_url", "scratch_pg_url"})
"""A test that asks for any of these (directly or through another fixture) talks to the services."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `services` every test that reaches PostgreSQL or Redis through a fixture, so that
    `make test-fast` (-m "not services and not slow") can leave them out without a list to keep."""
    for item in items:
        if SERVICE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.services)


def default_data_dir() -> Path:
    configured = os.environ.get("PRUNECAST_DATA_DIR")
    return Path(configured) if configured else REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    path = default_data_dir()
    if not (path / "wikitext-2-raw" / "wiki.test.raw").is_file():
        pytest.fail(f"WikiText-2 test split not found below {path}; set PRUNECAST_DATA_DIR")
    return path


@contextmanager
def scratch_database(prefix: str, admin_url: str = PG_ADMIN_URL) -> Iterator[str]:
    """A new empty PostgreSQL database (SQLAlchemy URL) on `admin_url`'s server, dropped after."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    base = admin_url.rsplit("/", 1)[0]
    try:
        yield f"{base.replace('postgresql://', 'postgresql+psycopg://', 1)}/{name}"
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh, migrated Postgres database for this test run, dropped at the end."""
    with scratch_database("prunecast_test") as url:
        upgrade(url)
        yield url


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """An empty Redis db (1..15) for this run, flushed before and after."""
    for db in range(15, 0, -1):
        client = redis.Redis.from_url(f"{REDIS_BASE_URL}/{db}")
        if client.dbsize() == 0 and client.set("prunecast:test-lock", "1", nx=True, ex=7200):
            url = f"{REDIS_BASE_URL}/{db}"
            break
    else:
        pytest.fail("no empty Redis db available for the test run")
    yield url
    client.flushdb()


@pytest.fixture
def clean_store(pg_url: str) -> Iterator[Store]:
    """The run's Postgres store, emptied before each test; the store's generation keeps its row (the
    TRUNCATE bumps it, so answers cached for the last test's store never answer for this one)."""
    store = Store(pg_url)
    with store.session() as session:
        tables = ", ".join(t.name for t in Base.metadata.sorted_tables if t.name != store_generation.TABLE)
        session.execute(text(f"TRUNCATE {tables} CASCADE"))
    yield store
    store.dispose()


@pytest.fixture
def clean_redis(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    _flush_keep_lock(client)
    yield client
    _flush_keep_lock(client)


def _flush_keep_lock(client: redis.Redis) -> None:
    client.flushdb()
    client.set("prunecast:test-lock", "1", ex=7200)


@pytest.fixture(scope="session")
def model_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tiny_model_dir(model_root: Path) -> Path:
    """A tiny random Llama with a byte-level tokenizer, saved like a real checkpoint."""
    from tests.tiny_models import build_tiny_causal_lm

    return build_tiny_causal_lm(model_root / "tiny-llama")


@pytest.fixture(scope="session")
def model_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One converted-model cache per test run, so the packaged GGUF is converted only once."""
    return tmp_path_factory.mktemp("model-cache")


FAST_LIFECYCLE = {
    "heartbeat_interval_s": 0.3,
    "heartbeat_timeout_s": 3.0,
    "reconcile_interval_s": 0.3,
    "requeue_grace_s": 0.5,
}


@pytest.fixture
def make_settings(
    tmp_path: Path, data_dir: Path, model_root: Path, model_cache_dir: Path
) -> Callable[..., Settings]:
    """Settings for a test: its own home, the shared data and models, fast heartbeats."""

    def build(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "home": tmp_path / "home",
            "data_dir": data_dir,
            "model_roots": [model_root],
            "cache_dir": model_cache_dir,
            "queue_name": f"test-{uuid.uuid4().hex[:8]}",
            "log_format": "console",
            **FAST_LIFECYCLE,
        }
        values.update(overrides)
        return Settings(**values)

    return build


@pytest.fixture
def rq_settings(
    make_settings: Callable[..., Settings], clean_store: Store, clean_redis: redis.Redis, redis_url: str
) -> Settings:
    return make_settings(database_url=clean_store.url, redis_url=redis_url)


@pytest.fixture
def api(rq_settings: Settings) -> Iterator[TestClient]:
    """The API on Postgres + Redis, with its reconciler running."""
    with TestClient(create_app(rq_settings)) as client:
        yield client


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment a worker subprocess needs to see the same store and queue."""
    env = dict(os.environ)
    env.update(
        {
            "DATABASE_URL": settings.store_url,
            "REDIS_URL": settings.redis_url or "",
            "PRUNECAST_QUEUE_NAME": settings.queue_name,
            "PRUNECAST_HOME": str(settings.home),
            "PRUNECAST_DATA_DIR": str(settings.data_dir),
            "PRUNECAST_MODEL_ROOTS": ":".join(str(root) for root in settings.model_roots),
            "PRUNECAST_CACHE_DIR": str(settings.model_cache_dir),
            "PRUNECAST_HEARTBEAT_INTERVAL_S": str(settings.heartbeat_interval_s),
            "PRUNECAST_HEARTBEAT_TIMEOUT_S": str(settings.heartbeat_timeout_s),
            "PRUNECAST_PROGRESS_TIMEOUT_S": str(settings.progress_timeout_s),
            "PRUNECAST_STORE_RETRY_S": str(settings.store_retry_s),
            "PRUNECAST_LOG_FORMAT": "json",
        }
    )
    return env


class WorkerProcess:
    """A real `prunecast worker` subprocess in its own process group."""

    def __init__(self, settings: Settings, log_path: Path) -> None:
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "worker", "--name", f"test-{uuid.uuid4().hex[:6]}"],
            env=settings_env(settings),
            cwd=REPO_ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, sig)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        self._log.close()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def start_worker(rq_settings: Settings, tmp_path: Path) -> Iterator[Callable[[], WorkerProcess]]:
    workers: list[WorkerProcess] = []

    def start() -> WorkerProcess:
        worker = WorkerProcess(rq_settings, tmp_path / f"worker-{len(workers)}.log")
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.stop()


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll until predicate() is truthy; fail the test with `what` on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")
