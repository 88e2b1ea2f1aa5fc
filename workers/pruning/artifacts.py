"""Saving and loading models pruned by `prune_model`: stock transformers checkpoints.

Every method here leaves a model stock `from_pretrained` can rebuild: intra-layer methods only
write zeros into existing weights, layer drops zero the dropped branches' writers, and ShortGPT
removes blocks and shrinks the config to match. A folder holds what `save_pretrained` writes
(config.json, safetensors weights, generation config) plus `prunecast_pruning.json`: the pruning
report and its provenance (source model and revision, calibration record, versions). That file is
written last, so a folder without it is incomplete.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import AutoModelForCausalLM, PreTrainedModel

from core.methods import PRUNED_ARTIFACT
from workers.artifact_descriptions import read_description, write_description
from workers.pruning.engine import PruningReport

ARTIFACT_KIND = PRUNED_ARTIFACT
PRUNING_FILE = "prunecast_pruning.json"
FORMAT = "prunecast-pruned"
FORMAT_VERSION = 1


def save_pruned(
    model: PreTrainedModel,
    report: PruningReport,
    folder: str | Path,
    *,
    model_id: str,
    revision: str | None,
    calibration_record: dict[str, Any] | None,
) -> Path:
    """Write `model` with `save_pretrained` (safetensors) and the pruning description; return the folder.

    `calibration_record` describes the data the statistics saw (None for magnitude) and is stored
    verbatim.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    description = {
        **report.to_dict(),
        "artifact_kind": ARTIFACT_KIND,
        "source_model_id": model_id,
        "revision": revision,
        "calibration": calibration_record,
    }
    write_description(folder / PRUNING_FILE, description, file_format=FORMAT, format_version=FORMAT_VERSION)
    return folder


def read_pruning_description(folder: str | Path) -> dict[str, Any]:
    """The prunecast_pruning.json of a pruned model folder, checked for format."""
    return read_description(
        folder, PRUNING_FILE, file_format=FORMAT, format_version=FORMAT_VERSION, what="pruned model"
    )


def load_pruned(folder: str | Path) -> tuple[PreTrainedModel, dict[str, Any]]:
    """(model in eval mode on the CPU, description) for a folder written by `save_pruned`.

    The description is the report's fields (method, layer_map, dropped_layers...) plus provenance.
    """
    description = read_pruning_description(folder)
    model = AutoModelForCausalLM.from_pretrained(Path(folder))
    return model.eval(), description
