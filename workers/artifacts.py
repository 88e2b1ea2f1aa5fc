"""A pruned model saved as a job's artifact.

`save_artifact` writes a pruned model to its folder in its pruner's format (`workers.pruners`), with
the dense model's tokenizer, and returns the `artifacts` row that describes it (kind, size, hash of
the weights). The description file each folder ends with is `workers.artifact_descriptions`'.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel

from core.tables import Artifact
from workers.offload import suspended
from workers.pruners import Pruner, Report


def save_artifact(
    model: PreTrainedModel,
    pruner: Pruner,
    report: Report,
    folder: Path,
    model_id: str,
    revision: str | None,
    calibration: dict[str, Any] | None,
    tokenizer: Any = None,
) -> Artifact:
    """Write the pruned model to `folder` (replacing what an earlier attempt left) in its pruner's
    format, with the dense model's tokenizer (so a stock folder is a whole checkpoint that
    `from_pretrained` and any serving engine read as it is), and describe it."""
    if folder.exists():
        shutil.rmtree(folder)
    with suspended(model):  # an offloaded model is saved from the CPU, whole
        weights = pruner.save(
            model, report, folder, model_id=model_id, revision=revision, calibration=calibration
        )
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    total_bytes = sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())
    return Artifact(
        kind=pruner.artifact_kind, path=str(folder), bytes=total_bytes, sha256=file_sha256(weights)
    )


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
