"""The store's tables (SQLAlchemy 2.0). Postgres in production, SQLite in embedded mode.

The store is the source of truth for jobs: a job row exists before anything is enqueued, and its
state changes only through the guarded transitions of `core.lifecycle`.
"""

from __future__ import annotations

import enum
import os
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    event,
)
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from core import store_generation


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_job_id() -> str:
    """A UUIDv7 (RFC 9562): random, yet ordered by creation time, so ids double as cursors."""
    millis = time.time_ns() // 1_000_000
    value = (millis & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version
    value |= int.from_bytes(os.urandom(10), "big") & ((1 << 76) - 1)
    value = (value & ~(0xC << 60)) | (0x8 << 60)  # RFC 4122 variant bits
    return str(uuid.UUID(int=value))


MAX_ROW_ID = 2**31 - 1
"""Largest value of an `Integer` column (ids, layers, steps): 32-bit on PostgreSQL. Ids and cursors
from clients are bounded by it, so an out-of-range one is a 422, not a store error."""


class JobStatus(enum.StrEnum):
    """The states of a job; `core.lifecycle` draws how they change and is the only writer."""

    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    canceled = "canceled"

    @property
    def terminal(self) -> bool:
        return self in (JobStatus.succeeded, JobStatus.failed, JobStatus.canceled)


# Stored as its value in a VARCHAR(16) (no database enum type, no CHECK): adding a state needs no
# migration of the column, and the Python side still only ever sees a JobStatus.
JOB_STATUS_TYPE = Enum(
    JobStatus,
    native_enum=False,
    create_constraint=False,
    length=16,
    values_callable=lambda states: [state.value for state in states],
    validate_strings=True,
)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC on every backend (SQLite hands back naive datetimes)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime given to the store; use core.tables.utcnow()")
        return value.astimezone(UTC) if value is not None else None

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, datetime: UTCDateTime}


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_job_id)
    kind: Mapped[str] = mapped_column(String(32), index=True)
    status: Mapped[JobStatus] = mapped_column(JOB_STATUS_TYPE, default=JobStatus.queued, index=True)
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    model_id: Mapped[str] = mapped_column(String(512), index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    enqueued_at: Mapped[datetime | None] = mapped_column(default=None)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
    heartbeat_at: Mapped[datetime | None] = mapped_column(default=None)
    # Last change of stage, fraction or detail: a job whose heartbeat goes on without one is hung.
    progress_at: Mapped[datetime | None] = mapped_column(default=None)
    stage: Mapped[str] = mapped_column(String(64), default="queued")
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    detail: Mapped[str | None] = mapped_column(String(256), default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    worker: Mapped[str | None] = mapped_column(String(128), default=None)
    idempotency_key: Mapped[str | None] = mapped_column(String(255), unique=True, default=None)
    request_hash: Mapped[str] = mapped_column(String(64))
    environment: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    # The job that created this one (a fanned-out sweep's per-sparsity prune jobs name their sweep).
    # No foreign key: adding one on SQLite would need a batch copy of `jobs` (see migration 0007),
    # and jobs are never deleted, so the reference cannot dangle.
    parent_id: Mapped[str | None] = mapped_column(String(36), index=True, default=None)


SIMULATED_SOURCE = "simulated"
RESULT_SOURCES = ("measured", "published", SIMULATED_SOURCE)
"""Where a result comes from: a job measured it; a paper published it (`core.published`); or a
`simulate` job simulated it (`workers.simulation`). Laws and baselines read measured rows only."""


class Result(Base):
    __tablename__ = "results"
    __table_args__ = (Index("ix_results_model_method_metric", "model_id", "method", "metric"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str | None] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), index=True, default=None
    )
    model_id: Mapped[str] = mapped_column(String(512))
    model_revision: Mapped[str | None] = mapped_column(String(128), default=None)
    method: Mapped[str] = mapped_column(String(32))  # "dense" for an unpruned model
    sparsity: Mapped[float] = mapped_column(Float, default=0.0)
    metric: Mapped[str] = mapped_column(String(64))  # e.g. "ppl", "acc", "acc_norm"
    dataset: Mapped[str] = mapped_column(String(128))
    split: Mapped[str | None] = mapped_column(String(64), default=None)
    protocol: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    value: Mapped[float] = mapped_column(Float)
    stderr: Mapped[float | None] = mapped_column(Float, default=None)
    n: Mapped[int | None] = mapped_column(Integer, default=None)
    source: Mapped[str] = mapped_column(String(16), default="measured")  # one of RESULT_SOURCES
    law: Mapped[str | None] = mapped_column(String(64), default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class DenseWindow(Base):
    """One evaluation window's mean NLL under a dense baseline (a `results` row) as scored in another
    dtype on a kind of device: what a simulation's bfloat16 windows are corrected by
    (`workers.simulation.cheap_windows`), so each is scored once per baseline, dtype and device."""

    __tablename__ = "dense_windows"
    __table_args__ = (UniqueConstraint("result_id", "scored_on", "window_index", name="uq_dense_windows"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    result_id: Mapped[int] = mapped_column(ForeignKey("results.id", ondelete="CASCADE"))
    scored_on: Mapped[str] = mapped_column(String(256))  # e.g. "bfloat16 on cpu (AVX512), torch 2.13.0"
    window_index: Mapped[int] = mapped_column(Integer)  # the window's place in its protocol
    nll: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ProbePoint(Base):
    """One deviation-probe measurement (docs/science.md §3): the measured value of `metric` in `space`
    at a layer / sublayer / generation step, and its Taylor estimate where one exists."""

    __tablename__ = "probe_points"
    __table_args__ = (Index("ix_probe_points_job_id_probe", "job_id", "probe"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    # counterfactual | model | generation-greedy | generation-sampled | mc-subspace (schemas.PROBE_KINDS)
    probe: Mapped[str] = mapped_column(String(32))
    layer: Mapped[int | None] = mapped_column(Integer, default=None)
    sublayer: Mapped[str | None] = mapped_column(String(16), default=None)  # attention | mlp | block
    space: Mapped[str] = mapped_column(String(16))  # embedding | logits | probs | tokens
    step: Mapped[int | None] = mapped_column(Integer, default=None)  # generation step
    metric: Mapped[str] = mapped_column(String(32))  # 1-cos | kl | agree | prefix_agree ...
    value: Mapped[float] = mapped_column(Float)
    estimate: Mapped[float | None] = mapped_column(Float, default=None)
    # the spread over the tokens (or prompts) the mean is over; null on points stored before 0006
    n: Mapped[int | None] = mapped_column(Integer, default=None)
    stderr: Mapped[float | None] = mapped_column(Float, default=None)
    value_min: Mapped[float | None] = mapped_column(Float, default=None)
    value_max: Mapped[float | None] = mapped_column(Float, default=None)
    # the rules the point was read by (core.probe_conventions); points stored before 0009: prunecast
    convention: Mapped[str] = mapped_column(String(16), default="prunecast", server_default="prunecast")


class Artifact(Base):
    __tablename__ = "artifacts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    path: Mapped[str] = mapped_column(String(1024))
    bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Fit(Base):
    """A prediction law fitted to measured points of one model, method, metric and protocol (a
    sweep stores one per metric), with how well every candidate law matched those points."""

    __tablename__ = "fits"
    __table_args__ = (Index("ix_fits_model_method_metric", "model_id", "method", "metric"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str | None] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), index=True, default=None
    )
    model_id: Mapped[str] = mapped_column(String(512))
    model_revision: Mapped[str | None] = mapped_column(String(128), default=None)
    method: Mapped[str] = mapped_column(String(32))
    metric: Mapped[str] = mapped_column(String(64))  # "ppl" (later "acc", "acc_norm" per task)
    dataset: Mapped[str] = mapped_column(String(128))
    # The protocol the points share: perplexity keys (steps.BASELINE_MATCH_KEYS), calibration...
    protocol: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    law: Mapped[str] = mapped_column(String(64))  # the chosen law, e.g. "alpha", "affine"
    formula: Mapped[str] = mapped_column(String(256))
    params: Mapped[dict[str, Any]] = mapped_column(JSON)  # the chosen law's parameters
    baseline: Mapped[float] = mapped_column(Float)  # the measured dense value (PPL0 or acc0)
    # [{"sparsity", "value", "result_id", "used"}], dense point first
    points: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    # law -> {"n", "r2", "max_ape", "mean_ape", "loo_rel_error", "formula", "params"}, strict included
    quality: Mapped[dict[str, Any]] = mapped_column(JSON)
    chosen_reason: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Profile(Base):
    """A dense model's profile under one calibration (a `profile` job, `workers.profiling`): what
    slicing would discard at every width, read by the feature laws (`core.prediction.feature_laws`)."""

    __tablename__ = "profiles"
    __table_args__ = (Index("ix_profiles_model_id", "model_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    model_id: Mapped[str] = mapped_column(String(512))
    model_revision: Mapped[str | None] = mapped_column(String(128), default=None)
    family: Mapped[str] = mapped_column(String(64))
    hidden_size: Mapped[int] = mapped_column(Integer)
    num_layers: Mapped[int] = mapped_column(Integer)
    # The calibration record (corpus, sha256, windows, seqlen, seed), round_to, lens tokens, dtype,
    # device, timings and versions: a profile predicts prunings calibrated the same way.
    protocol: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    sparsities: Mapped[list[float]] = mapped_column(JSON)  # the lens readings' sparsities
    widths: Mapped[list[int]] = mapped_column(JSON)  # d per sparsity
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    signals: Mapped[list[ProfileSignal]] = relationship(
        back_populates="profile", cascade="all, delete-orphan", order_by="ProfileSignal.position"
    )
    linears: Mapped[list[ProfileLinear]] = relationship(
        back_populates="profile", cascade="all, delete-orphan", order_by="ProfileLinear.id"
    )


class ProfileSignal(Base):
    """One residual signal of a profile: its spectrum, token energies and lens readings."""

    __tablename__ = "profile_signals"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    profile_id: Mapped[int] = mapped_column(ForeignKey("profiles.id", ondelete="CASCADE"), index=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    position: Mapped[int] = mapped_column(Integer)  # 0 the embedding output, then along the stream
    kind: Mapped[str] = mapped_column(String(16))  # embedding | pre-mlp | output
    layer: Mapped[int | None] = mapped_column(Integer, default=None)
    eigenvalues: Mapped[list[float]] = mapped_column(JSON)  # of the calibration's C / positions, descending
    energy: Mapped[list[float]] = mapped_column(JSON)  # per eigenvector, on the measured windows, sums to 1
    token_energy: Mapped[list[float]] = mapped_column(JSON)  # the same for the normalised tokens
    lens: Mapped[list[dict[str, Any]]] = mapped_column(JSON)  # [{width, kl, kl_taylor, nll_increase}]
    profile: Mapped[Profile] = relationship(back_populates="signals")


class ProfileLinear(Base):
    """One block linear of a profile: e(s), the share of its output energy each unstructured mask
    rule would remove at the profile's sparsities (`workers.profiling.mask_errors`)."""

    __tablename__ = "profile_linears"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    profile_id: Mapped[int] = mapped_column(ForeignKey("profiles.id", ondelete="CASCADE"), index=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    layer: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(128))  # path in its block, e.g. "mlp.down_proj"
    rows: Mapped[int] = mapped_column(Integer)
    columns: Mapped[int] = mapped_column(Integer)
    output_energy: Mapped[float] = mapped_column(Float)  # tr(W C W^T), mean squared output per token
    errors: Mapped[dict[str, list[float]]] = mapped_column(JSON)  # rule -> e(s) per profile sparsity
    profile: Mapped[Profile] = relationship(back_populates="linears")


class StoreGeneration(Base):
    """One row: a counter bumped by triggers whenever what predictions read changes
    (`core.store_generation`), so a prediction's caches are keyed by one primary-key read."""

    __tablename__ = store_generation.TABLE

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    generation: Mapped[int] = mapped_column(BigInteger, default=0)


@event.listens_for(Base.metadata, "after_create")
def _install_store_generation(target: Any, connection: Connection, **kw: Any) -> None:
    """`create_all` (tests, scratch stores) gets the same triggers as a migrated store."""
    if any(table.name == store_generation.TABLE for table in kw.get("tables", ())):
        for statement in store_generation.install_statements(connection.dialect.name):
            connection.exec_driver_sql(statement)
