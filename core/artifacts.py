"""Where a job's files live on the artifact volume, and how a canceled job's files go.

Every file a job writes lies below `<PRUNECAST_ARTIFACT_DIR>/<job id>/` (a shared volume when
several hosts run workers), so the API, the reconciler and the worker can all remove what a
canceled job left, whichever of them records the cancel.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

from core.settings import Settings


def job_folder(settings: Settings, job_id: str) -> Path:
    """The folder all of one job's artifacts are written below."""
    return settings.artifacts_dir / job_id


def remove_job_files(settings: Settings, job_id: str, recorded: Iterable[str] = ()) -> None:
    """Delete the job's folder and any recorded artifact path, where they lie inside this host's
    artifact directory (never anything outside it)."""
    root = settings.artifacts_dir.resolve()
    for path in [*recorded, str(job_folder(settings, job_id))]:
        folder = Path(path).resolve()
        if folder.is_relative_to(root) and folder != root:
            shutil.rmtree(folder, ignore_errors=True)
