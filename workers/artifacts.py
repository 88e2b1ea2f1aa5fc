"""A pruned model saved as a job's artifact, and the JSON description its folder ends with.

`save_artifact` writes a pruned model to its folder in its pruner's format, with the dense model's
tokenizer, and returns the `artifacts` row that describes it (kind, size, hash of the weights).

Every saved folder ends with a description file (prunecast_pruning.json, slicing_config.json):
what was done to the model, its provenance and the library versions. Each artifact writer
(`workers.slicing.artifacts`, `workers.pruning.artifacts`) writes its description last with
`write_description`, so a folder without it is incomplete; readers check the format name and
version (`read_description`) before trusting anything else in the folder.

The pruners import this module (through their writers), so it names them for type checking only.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import transformers
from transformers import PreTrainedModel

from core.tables import Artifact
from workers.offload import suspended

if TYPE_CHECKING:
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


def write_description(
    path: Path, description: dict[str, Any], *, file_format: str, format_version: int
) -> None:
    """Write `description` with its format, format version and the torch / transformers versions, as
    indented JSON with sorted keys."""
    full = {
        **description,
        "format": file_format,
        "format_version": format_version,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    path.write_text(json.dumps(full, indent=2, sort_keys=True) + "\n")


def read_description(
    folder: str | Path, file_name: str, *, file_format: str, format_version: int, what: str
) -> dict[str, Any]:
    """The description `file_name` of `folder` (a `what` folder), checked for format and version."""
    path = Path(folder) / file_name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: {folder} is not a (complete) {what} folder")
    description: dict[str, Any] = json.loads(path.read_text())
    if description.get("format") != file_format or description.get("format_version") != format_version:
        raise ValueError(
            f"{path} has format {description.get('format')!r} version {description.get('format_version')!r}; "
            f"this code reads {file_format!r} version {format_version}"
        )
    return description
