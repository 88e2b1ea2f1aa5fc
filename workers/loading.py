"""Load a resolved model source into memory, ready to evaluate or slice.

Packaged models ship as GGUF, which transformers dequantises slowly (~15-25 s) and refuses to
save. The first load therefore converts the GGUF once into an ordinary transformers folder under
the model cache; every later load, in any worker process, reads that folder in well under a
second. Importing this module never touches CUDA: devices are only probed inside `load_model`.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import fcntl
import gc
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import transformers
from safetensors import SafetensorError, safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from core.model_sources import ModelSource, assembled_gguf
from core.settings import Settings
from workers.architectures import UnsupportedArchitectureError, match_structure
from workers.host_weights import HostWeights, choose_home, read_into_memory
from workers.offload import MemoryPlan, OffloadError, offload, plan_memory
from workers.slicing.artifacts import is_per_layer_sliced, load_sliced

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
DEVICES = ("auto", "cpu", "cuda")
# Written next to the converted weights: where they came from, so a cache folder explains itself.
CONVERSION_RECORD = "prunecast_conversion.json"


class ModelLoadError(RuntimeError):
    """The model could not be loaded; the message names the model and the cause."""


@dataclass
class LoadedModel:
    """A model in eval mode on its device, with the ids results are recorded under."""

    model: PreTrainedModel
    tokenizer: Any  # a transformers tokenizer; their classes share no useful static type
    model_id: str
    revision: str | None  # HF commit, or the cache key of a converted packaged GGUF
    device: torch.device
    dtype: torch.dtype
    source_kind: str  # "packaged" | "local" | "hf_cache"
    path: Path  # the folder the weights were read from (the converted cache for packaged models)
    memory_plan: MemoryPlan  # resident on `device`, or offloaded (blocks streamed through it)


def resolve_device(device: str = "auto") -> torch.device:
    """'auto' picks CUDA when present; asking for CUDA on a host without it is an error."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("device 'cuda' was requested but this host has no usable CUDA device")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """'auto' is float32 on CPU (bf16 matmuls are slow there) and bfloat16 on CUDA."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of auto, {', '.join(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def load_model(
    source: ModelSource,
    settings: Settings,
    *,
    dtype: str = "float32",
    device: str = "auto",
    offload: str = "auto",
) -> LoadedModel:
    """Load `source` with its tokenizer, in eval mode on `device` (whole, or offloaded there as
    `offload` and the device's budget decide: workers.offload); raise ModelLoadError if it fails."""
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    revision = source.revision
    if source.kind == "packaged":
        folder = ensure_converted(source, settings)
        revision = folder.name
    else:
        folder = source.path
    model = _load_causal_lm(folder, source.model_id, torch_dtype)
    tokenizer = _load_tokenizer(folder, source.model_id)
    model.eval()
    plan = settle_host_weights(
        model, folder, torch_device, memory_plan(model, torch_device, offload, settings.device_memory_bytes)
    )
    place(model, torch_device, plan)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        model_id=source.model_id,
        revision=revision,
        device=torch_device,
        dtype=torch_dtype,
        source_kind=source.kind,
        path=folder,
        memory_plan=plan,
    )


def memory_plan(
    model: torch.nn.Module, device: torch.device, mode: str, configured: int | None
) -> MemoryPlan:
    """Whether `model` (on the CPU) runs whole on `device` or offloaded; ModelLoadError if neither."""
    try:
        blocks = match_structure(model).blocks(model)
    except UnsupportedArchitectureError:
        blocks = torch.nn.ModuleList()  # nothing to stream: the plan counts it all as resident
    try:
        return plan_memory(model, blocks, device, mode, configured)
    except OffloadError as error:
        raise ModelLoadError(str(error)) from error


def settle_host_weights(
    model: torch.nn.Module, folder: Path, device: torch.device, plan: MemoryPlan
) -> MemoryPlan:
    """Read the weights whose home is the host into process memory (workers.host_weights), unless
    the model is too large for the host; `plan` gains what was done."""
    if device.type != "cpu" and not plan.offloaded:
        host = HostWeights("device", 0, 0, 0, "the model is resident on the device; the host keeps no copy")
    else:
        home, reason = choose_home(plan.model_bytes)
        try:
            host = (
                read_into_memory(model, folder, reason)
                if home == "memory"
                else HostWeights(home, 0, 0, 0, reason)
            )
        except OSError as error:
            raise ModelLoadError(
                f"cannot read the weights in {folder} into memory ({error}); replace the model folder"
            ) from error
    return dataclasses.replace(plan, host_weights=host)


def place(model: torch.nn.Module, device: torch.device, plan: MemoryPlan) -> None:
    """Put `model` (on the CPU) where `plan` says: whole on `device`, or offloaded to it."""
    if plan.offloaded:
        offload(model, match_structure(model).blocks(model), device)
    else:
        model.to(device)


def refresh_model(loaded: LoadedModel) -> None:
    """Replace `loaded.model` (e.g. sliced in place) by a fresh dense copy read again from the folder
    it came from, in eval mode on the same device and dtype; the tokenizer is kept.

    For jobs that slice one model at several sparsities. The old model is released before the new
    one is read, so peak memory stays one model. Re-reading the safetensors folder is cheaper and
    safer than keeping a dense master to `copy.deepcopy`: on SmolLM2-135M fp32 (CPU, warm page
    cache) a reload took 0.09-0.12 s and 15 MB of RSS at load time (the weights are memory-mapped),
    a deep copy 1.5-2.8 s and about 1 GB, and a master would keep a second full model on the device
    (GPU) for the whole job.
    """
    loaded.model = None  # type: ignore[assignment]  # release the old copy before reading the next
    gc.collect()
    loaded.model = load_copy(loaded).model


def load_copy(loaded: LoadedModel) -> LoadedModel:
    """An independent copy of `loaded`'s model, read again from its folder (same device, dtype and
    tokenizer): for jobs that need the dense model and a pruned one side by side. The copy is planned
    again, against what the device has left with the first one on it: a model that fits once may
    not fit twice, and the copy is then offloaded."""
    model = _load_causal_lm(loaded.path, loaded.model_id, loaded.dtype)
    model.eval()
    plan = loaded.memory_plan
    plan = memory_plan(model, loaded.device, plan.mode, plan.configured_budget)
    plan = settle_host_weights(model, loaded.path, loaded.device, plan)
    place(model, loaded.device, plan)
    return dataclasses.replace(loaded, model=model, memory_plan=plan)


def conversion_key(gguf_path: Path) -> str:
    """Identity of a packaged GGUF: a new package version changes size or name, hence the folder."""
    identity = f"{gguf_path.name}:{gguf_path.stat().st_size}"
    return hashlib.sha256(identity.encode()).hexdigest()[:12]


def ensure_converted(source: ModelSource, settings: Settings) -> Path:
    """Return the cached transformers folder for a packaged GGUF, converting it on first use.

    Conversion writes to a temporary folder renamed into place at the end, under an exclusive
    file lock, so concurrent workers neither convert twice nor read a half-written folder.
    """
    if source.gguf_file is None:
        raise ValueError(f"model {source.model_id!r} is not a packaged GGUF model")
    assembled_gguf(source)  # a GGUF shipped in parts is joined (and its SHA-256 checked) first
    alias_dir = settings.model_cache_dir / source.model_id
    final = alias_dir / conversion_key(source.path)
    if final.is_dir():
        return final
    alias_dir.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(alias_dir / f".{final.name}.lock"):
        if final.is_dir():  # another worker finished while we waited for the lock
            return final
        for stale in alias_dir.glob(f".{final.name}.partial-*"):  # left by a worker killed mid-way
            shutil.rmtree(stale, ignore_errors=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{final.name}.partial-", dir=alias_dir))
        try:
            _convert_gguf(source, scratch)
            os.rename(scratch, final)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return final


@contextlib.contextmanager
def _exclusive_lock(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _convert_gguf(source: ModelSource, target: Path) -> None:
    """Dequantise the GGUF to fp32 and save it as a plain safetensors folder with its tokenizer."""
    folder, gguf_file = source.path.parent, source.path.name
    started = time.perf_counter()
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
        gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file)
    except (OSError, ValueError, KeyError, RuntimeError, ImportError) as error:
        raise ModelLoadError(f"model {source.model_id!r}: cannot read {source.path} ({error})") from error
    # A GGUF-loaded model carries a quantizer and refuses save_pretrained; rebuild a plain one.
    config = copy.deepcopy(gguf_model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(gguf_model.state_dict())
    plain.save_pretrained(target)
    tokenizer.save_pretrained(target)
    record = {
        "model_id": source.model_id,
        "gguf_file": gguf_file,
        "gguf_bytes": source.path.stat().st_size,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "conversion_s": round(time.perf_counter() - started, 2),
    }
    (target / CONVERSION_RECORD).write_text(json.dumps(record, indent=2) + "\n")


def _load_causal_lm(folder: Path, model_id: str, dtype: torch.dtype) -> PreTrainedModel:
    if is_per_layer_sliced(folder):  # prunecast's own format: its loader, never remote code
        try:
            sliced: Any = load_sliced(folder)
        except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as error:
            raise ModelLoadError(
                f"model {model_id!r}: cannot load the sliced model in {folder} ({error})"
            ) from error
        sliced.to(dtype)
        return cast(PreTrainedModel, sliced)
    _check_model_type(folder, model_id)
    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, KeyError) as error:
        raise ModelLoadError(f"model {model_id!r}: cannot read its config in {folder} ({error})") from error
    known = AutoModelForCausalLM._model_mapping  # config class -> causal LM class
    if type(config) not in known:
        architectures = ", ".join(getattr(config, "architectures", None) or []) or config.model_type
        raise ModelLoadError(
            f"model {model_id!r}: architecture {architectures} (model_type {config.model_type!r}) "
            "is not a causal LM transformers knows"
        )
    try:
        model = AutoModelForCausalLM.from_pretrained(
            folder, config=config, local_files_only=True, trust_remote_code=False, dtype=dtype
        )
    except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as error:
        corrupt = unreadable_weight_file(folder)
        where = (
            f"the weights file {corrupt} is unreadable" if corrupt else f"cannot load weights from {folder}"
        )
        raise ModelLoadError(
            f"model {model_id!r}: {where} ({type(error).__name__}: {error}); replace the file or the "
            "model folder"
        ) from error
    return model


def unreadable_weight_file(folder: Path) -> Path | None:
    """The first safetensors file of `folder` whose header does not parse (truncated, corrupt)."""
    for path in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt") as handle:
                handle.keys()
        except (SafetensorError, OSError, ValueError):
            return path
    return None


def _check_model_type(folder: Path, model_id: str) -> None:
    """Name the problem plainly before transformers words it as an upgrade suggestion."""
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(f"model {model_id!r}: cannot read its config: no config.json in {folder}")
    try:
        model_type = json.loads(config_path.read_text()).get("model_type")
    except (OSError, ValueError, AttributeError) as error:
        raise ModelLoadError(f"model {model_id!r}: cannot read its config {config_path} ({error})") from error
    if model_type is not None and model_type not in CONFIG_MAPPING:
        raise ModelLoadError(
            f"model {model_id!r}: cannot read its config: model_type {model_type!r} is not an architecture "
            f"transformers {transformers.__version__} knows"
        )


def _load_tokenizer(folder: Path, model_id: str) -> Any:
    try:
        return AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ModelLoadError(
            f"model {model_id!r}: cannot load its tokenizer from {folder} ({error})"
        ) from error
