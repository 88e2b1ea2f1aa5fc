"""One validated settings object, read from the environment once at start.

Every knob has a safe default so that `prunecast serve` with nothing set runs the embedded
deployment (SQLite file + in-process worker) under ``PRUNECAST_HOME``.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

DEFAULT_HOME = Path.home() / ".prunecast"


def _split_list(value: object, separator: str) -> object:
    """Environment lists are plain separated strings, not JSON."""
    if isinstance(value, str):
        return [item.strip() for item in value.split(separator) if item.strip()]
    return value


class Settings(BaseSettings):
    """Service settings; environment variable names are given per field."""

    model_config = SettingsConfigDict(env_prefix="PRUNECAST_", extra="ignore", populate_by_name=True)

    # Where the embedded deployment keeps its SQLite file, model cache and artifacts.
    home: Path = DEFAULT_HOME
    # SQLAlchemy URL of the store; unset -> SQLite file under `home` (embedded mode).
    database_url: str | None = Field(default=None, validation_alias="DATABASE_URL")
    # Redis URL of the RQ queue; unset -> in-process worker thread (embedded mode).
    redis_url: str | None = Field(default=None, validation_alias="REDIS_URL")
    # RQ queue name; tests use their own so that runs never see each other's jobs.
    queue_name: str = "prunecast"
    # Datasets such as wikitext-2-raw/wiki.test.raw live below this folder.
    data_dir: Path | None = None
    # Local model directories may only be read below these roots (colon-separated).
    model_roots: Annotated[list[Path], NoDecode] = Field(default_factory=list)
    # Converted packaged models and other reusable downloads; default `home`/cache.
    cache_dir: Path | None = None
    # Bytes a job may put on its device; unset -> a CUDA device's free memory (none on a CPU). A model
    # over 80 % of it runs offloaded (blocks streamed through the device); setting it on a CPU host
    # rehearses that path.
    device_memory_bytes: int | None = Field(default=None, gt=0)
    # Pruned models written by jobs; default `home`/artifacts. Shared volume in production.
    artifact_dir: Path | None = None
    # Bearer tokens accepted by /v1 (comma-separated); empty -> no authentication.
    api_tokens: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # Run the job worker thread inside `serve` when no Redis is configured.
    embedded_worker: bool = True
    # Seconds between worker heartbeats, and after which a silent running job is presumed dead.
    heartbeat_interval_s: float = Field(default=5.0, gt=0)
    heartbeat_timeout_s: float = Field(default=60.0, gt=0)
    # Seconds between reconciler passes (re-enqueue lost jobs, recover dead ones).
    reconcile_interval_s: float = Field(default=10.0, gt=0)
    # A queued job is only presumed lost from the queue once it is this old (enqueue in flight).
    requeue_grace_s: float = Field(default=5.0, ge=0)
    # Seconds without new progress (stage, fraction or detail) after which a running job whose
    # heartbeat goes on is presumed hung: retried, or failed on its last attempt.
    progress_timeout_s: float = Field(default=1800.0, gt=0)
    # Attempts a job gets before a lost worker fails it for good.
    max_attempts: int = Field(default=2, ge=1)
    # How long a worker retries a write it cannot do without (results, outcome) through a store
    # outage before it gives the attempt up to the reconciler.
    store_retry_s: float = Field(default=60.0, gt=0)
    # Retry-After (seconds) of the 503 a request gets while the store is unreachable.
    store_retry_after_s: int = Field(default=5, ge=1)
    # Put /metrics behind the API token too (when tokens are set); off: Prometheus scrapes freely.
    metrics_require_token: bool = False
    # Put /docs, /redoc and /openapi.json behind the API token too (when tokens are set); a browser
    # answers the login prompt they send with the token as the password (app/docs_access.py).
    docs_require_token: bool = False
    # Request bodies above this size are refused with 413.
    max_body_bytes: int = Field(default=1_000_000, gt=0)
    # Longest a client may block on GET /v1/jobs/{id}/wait.
    max_wait_s: float = Field(default=300.0, gt=0)
    # Log format: "json" for machines, "console" for people.
    log_format: str = "json"
    log_level: str = "INFO"

    @field_validator("model_roots", mode="before")
    @classmethod
    def _parse_roots(cls, value: object) -> object:
        return _split_list(value, ":")

    @field_validator("api_tokens", mode="before")
    @classmethod
    def _parse_tokens(cls, value: object) -> object:
        return _split_list(value, ",")

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if self.heartbeat_timeout_s <= 2 * self.heartbeat_interval_s:
            raise ValueError(
                "PRUNECAST_HEARTBEAT_TIMEOUT_S must exceed twice PRUNECAST_HEARTBEAT_INTERVAL_S, "
                "or healthy jobs would be presumed dead"
            )
        if any(len(token) < 16 for token in self.api_tokens):
            raise ValueError("every PRUNECAST_API_TOKENS entry must be at least 16 characters")
        if any(not token.isascii() or not token.isprintable() or " " in token for token in self.api_tokens):
            raise ValueError("PRUNECAST_API_TOKENS entries must be printable ASCII without spaces")
        if self.log_format not in ("json", "console"):
            raise ValueError("PRUNECAST_LOG_FORMAT must be 'json' or 'console'")
        self.model_roots = [root.expanduser().resolve() for root in self.model_roots]
        return self

    @property
    def embedded(self) -> bool:
        """True when jobs run in this process (no Redis configured)."""
        return self.redis_url is None

    @property
    def store_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'prunecast.db'}"

    @property
    def model_cache_dir(self) -> Path:
        return self.cache_dir or self.home / "cache"

    @property
    def artifacts_dir(self) -> Path:
        return self.artifact_dir or self.home / "artifacts"


@lru_cache
def get_settings() -> Settings:
    """The process-wide settings, read from the environment on first use."""
    return Settings()
