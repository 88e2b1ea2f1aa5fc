"""Saving and loading sliced models.

A sliced model folder holds:
- `model.safetensors`: every parameter and persistent buffer of the sliced model, by its name in
  the sliced module tree (blocks appear as `...layers.<i>.block.*` plus `...layers.<i>.attn_skip`
  and `...layers.<i>.mlp_skip`);
- `config.json` of model_type `prunecast_sliced`: the dense model's HF config (head untied) under
  `base_config`, the widths and the family's declaration under `sliced`, and an `auto_map` naming
  `modeling_prunecast_sliced.py`, copied into the folder with its two siblings (the portable code,
  `workers.slicing.portable`); folders written before that hold the dense config itself, and
  `load_sliced` reads both;
- `slicing_config.json`: what was sliced and how (family, d per signal, sparsity, source model id
  and revision, calibration details, parameter counts, versions). Written last: a folder without
  it is incomplete.

Why this is not a stock `from_pretrained` checkpoint: SliceGPT gives every block two skip
matrices, so each residual add computes x @ S + branch(x). Stock HF decoder blocks hard-code
x + branch(x), and no config field adds a matrix there; nor can S be folded into neighbouring
weights, because it acts on the residual stream itself. The widths also differ per signal (the
last block writes D while the rest of the stream has d) where an HF config has one hidden_size,
and the weight-free norms divide by the dense width D. `load_sliced` therefore rebuilds the dense
architecture from the config, applies the same structural changes the engine made, and loads
the weights strictly, so every key and shape is checked; `from_pretrained(folder,
trust_remote_code=True)` runs that same code from the folder (the service itself never enables
remote code: it calls `load_sliced`).

A stock form exists only if one basis is shared by every signal, making every S the identity: the
stock layout (`workers.slicing.stock`), a different algorithm offered beside the paper's:
its folder is plain `save_pretrained` output (config.json with hidden_size d, model.safetensors
or shards) plus slicing_config.json with `"layout": "stock"`, and `load_sliced` reads it with
`AutoModelForCausalLM.from_pretrained`, exactly as any other program would.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from core.families import family_from_config
from core.methods import STOCK_LAYOUT
from workers.architectures import adapter_for_family
from workers.artifact_descriptions import read_description, write_description
from workers.slicing import portable
from workers.slicing.portable.modeling_prunecast_sliced import (
    AUTO_MAP,
    MODEL_TYPE,
    PORTABLE_FILES,
    PrunecastSlicedConfig,
    build_sliced_model,
)
from workers.slicing.report import SlicingReport

WEIGHTS_FILE = "model.safetensors"
# The kept directions of every block-boundary signal (probes read them), in safetensors format but not
# named *.safetensors: loaders that glob a folder for weight files (serving engines) must not read it.
BASES_FILE = "slicing_bases.st"
SLICING_CONFIG_FILE = "slicing_config.json"
FORMAT = "prunecast-slicegpt"
FORMAT_VERSION = 1


def save_sliced(
    model: PreTrainedModel,
    report: SlicingReport,
    folder: str | Path,
    *,
    source_model_id: str,
    revision: str | None,
    calibration: dict[str, Any],
) -> Path:
    """Write a sliced model (as produced by `slice_model`) to `folder`; return the folder.

    `calibration` describes the data the PCAs saw (corpus, split, sequences, seqlen, seed, data
    hash...) and is stored verbatim in slicing_config.json.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if report.layout == STOCK_LAYOUT:
        model.save_pretrained(folder)  # config.json, generation_config.json, weights (sharded if large)
        weights_file = WEIGHTS_FILE if (folder / WEIGHTS_FILE).exists() else f"{WEIGHTS_FILE}.index.json"
    else:
        state = {name: tensor.detach().to("cpu").contiguous() for name, tensor in model.state_dict().items()}
        safetensors.torch.save_file(
            state, str(folder / WEIGHTS_FILE), metadata={"format": "pt", "producer": FORMAT}
        )
        model.config.tie_word_embeddings = False
        _save_remote_code_config(model, report, folder)
        weights_file = WEIGHTS_FILE
    description = {
        "method": "slicegpt",
        "layout": report.layout,
        "pooling": report.pooling,
        "family": report.family,
        "hidden_size": report.hidden_size,
        "sparsity": report.sparsity,
        "round_to": report.round_to,
        "slice_head": report.slice_head,
        "widths": report.widths.to_dict(),
        "source_model_id": source_model_id,
        "revision": revision,
        "calibration": calibration,
        "params_before": report.params_before,
        "params_after": report.params_after,
        "param_fraction_removed": report.param_fraction_removed,
        "dtype": report.dtype,
        "weights_file": weights_file,
        "bases_file": _save_bases(report, folder),
    }
    write_description(
        folder / SLICING_CONFIG_FILE, description, file_format=FORMAT, format_version=FORMAT_VERSION
    )
    return folder


def _save_bases(report: SlicingReport, folder: Path) -> str | None:
    """`SlicingReport.bases` in BASES_FILE (the stock layout's one basis once, as "shared"); its name."""
    if not report.bases:
        return None
    shared = all(basis is report.bases[0] for basis in report.bases)
    tensors = (
        {"shared": report.bases[0]} if shared else {f"signal.{k}": b for k, b in enumerate(report.bases)}
    )
    metadata = {"signals": str(len(report.bases)), "shared": str(shared)}
    safetensors.torch.save_file(tensors, str(folder / BASES_FILE), metadata=metadata)
    return BASES_FILE


def load_bases(folder: str | Path) -> list[torch.Tensor] | None:
    """The kept directions a sliced folder stored (see `SlicingReport.bases`), or None if it has none."""
    folder = Path(folder)
    name = read_slicing_config(folder).get("bases_file")
    if not name:
        return None
    with safetensors.safe_open(str(folder / name), framework="pt") as handle:
        metadata = handle.metadata()
        signals = int(metadata["signals"])
        if metadata["shared"] == "True":
            return [handle.get_tensor("shared")] * signals
        return [handle.get_tensor(f"signal.{k}") for k in range(signals)]


def _save_remote_code_config(model: PreTrainedModel, report: SlicingReport, folder: Path) -> None:
    """config.json of model_type prunecast_sliced naming the portable code in `auto_map`, and that
    code, so `from_pretrained(folder, trust_remote_code=True)` works without prunecast."""
    sliced = {
        "widths": report.widths.to_dict(),
        "adapter": adapter_for_family(report.family).declaration(),
        "weights_file": WEIGHTS_FILE,
    }
    config = PrunecastSlicedConfig(base_config=model.config.to_dict(), sliced=sliced)
    config.auto_map = AUTO_MAP
    config.architectures = ["PrunecastSlicedForCausalLM"]
    config.save_pretrained(folder)
    source = Path(portable.__file__).parent
    for name in PORTABLE_FILES:
        shutil.copyfile(source / name, folder / name)


def is_per_layer_sliced(folder: Path) -> bool:
    """Whether `folder` holds a per-layer sliced model (its config.json is of model_type
    prunecast_sliced), which only `load_sliced` (or remote code) can read."""
    try:
        return json.loads((folder / "config.json").read_text()).get("model_type") == MODEL_TYPE
    except (OSError, ValueError, AttributeError):
        return False


def read_slicing_config(folder: str | Path) -> dict[str, Any]:
    """The slicing_config.json of a sliced model folder, checked for format."""
    return read_description(
        folder, SLICING_CONFIG_FILE, file_format=FORMAT, format_version=FORMAT_VERSION, what="sliced model"
    )


def load_sliced(folder: str | Path, *, device: torch.device | str = "cpu") -> PreTrainedModel:
    """Rebuild a sliced model saved by `save_sliced` (either layout); its logits equal the saved model's."""
    folder = Path(folder)
    description = read_slicing_config(folder)
    if description.get("layout") == STOCK_LAYOUT:
        dtype = getattr(torch, str(description["dtype"]))
        stock = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, device_map=str(device))
        return stock.eval()
    config = json.loads((folder / "config.json").read_text())
    base_config = config["base_config"] if config.get("model_type") == MODEL_TYPE else config  # older folders
    adapter = adapter_for_family(description["family"])
    if family_from_config(base_config) != adapter.name:
        raise ValueError(f"config.json in {folder} does not describe a {adapter.name}-family model")
    state = safetensors.torch.load_file(str(folder / description["weights_file"]), device=str(device))
    model: Any = build_sliced_model(base_config, adapter, description["widths"], state)
    model.to(device)
    return model
