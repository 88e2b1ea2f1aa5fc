"""The JSON description every saved pruned-model folder ends with (prunecast_pruning.json,
slicing_config.json): what was done to the model, its provenance and the library versions.

Each artifact writer (`workers.slicing.artifacts`, `workers.pruning.artifacts`) writes its description
last with `write_description`, so a folder without it is incomplete; readers check the format name and
version (`read_description`) before trusting anything else in the folder. The lowest room of saving:
it imports no pruner and no writer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import transformers


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
