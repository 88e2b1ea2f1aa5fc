"""What clients see of jobs and the files they wrote."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field, computed_field

from app.schemas.base import FromRow, ModelId
from core.tables import JobStatus


class JobLinks(BaseModel):
    self: str
    wait: str
    results: str
    artifacts: str
    probes: str


class JobPublic(FromRow):
    """A job as clients see it: request, lifecycle state (docs/architecture.md) and progress."""

    id: str
    kind: str
    status: JobStatus
    model: ModelId
    request: dict[str, Any]
    stage: str
    progress: float = Field(description="0..1 within the whole job.")
    detail: str | None = Field(None, description="Human-readable progress, e.g. 'window 7/20'.")
    error: str | None = Field(None, description="Why the job failed, was canceled or was retried.")
    attempts: int
    worker: str | None = Field(None, description="host:pid of the process running the current attempt.")
    cancel_requested: bool
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None
    environment: dict[str, Any] | None = Field(None, description="Versions and device of the run.")
    parent_id: str | None = Field(
        None,
        description="The job that created this one (a fanned-out sweep, for its per-sparsity prune jobs).",
    )

    @computed_field  # type: ignore[prop-decorator]
    @property
    def links(self) -> JobLinks:
        base = f"/v1/jobs/{self.id}"
        return JobLinks(
            self=base,
            wait=f"{base}/wait",
            results=f"{base}/results",
            artifacts=f"{base}/artifacts",
            probes=f"{base}/probes",
        )


class JobList(BaseModel):
    items: list[JobPublic]
    next_cursor: str | None = Field(None, description="Pass as `cursor` to get the next page.")


class ArtifactPublic(FromRow):
    """A file or folder a job wrote (e.g. a sliced model), on the artifact volume."""

    id: int
    job_id: str
    kind: str = Field(
        description="`sliced-model`: load it with `workers.slicing.artifacts.load_sliced`; `pruned-model`: a "
        "stock transformers checkpoint (`AutoModelForCausalLM.from_pretrained`)."
    )
    path: str = Field(description="Folder on the artifact volume (PRUNECAST_ARTIFACT_DIR).")
    bytes: int = Field(description="Total size of the files in the folder.")
    sha256: str = Field(description="SHA-256 of the weights file (model.safetensors).")
    created_at: datetime


class ArtifactList(BaseModel):
    items: list[ArtifactPublic]
