"""Where a model's weights live in host memory: read into the process, or mapped from their files.

transformers loads safetensors through a memory map. A weight's pages come from the file when first
touched and count as the process's (file-backed) memory for as long as any tensor of that file
lives, because every tensor is a view of the one map. An engine that replaces weights (slicing
rotates every matrix; the pruners' masked copies; a sliced head) therefore holds each mapped
original beside its replacement until the last original is gone: on SmolLM2-135M that was about
one extra model (docs/architecture.md, "Memory").

`read_into_memory` gives every weight its own ordinary allocation, filled by a plain file read that
never touches the map; once the last mapped tensor is released the map closes, and a weight an
engine replaces frees its memory at once. It costs one read of the files (from the page cache on a
warm host, ~0.3 s for 0.5 GB). A model larger than the host's memory is left mapped
(`choose_home`): the kernel then pages its weights in and out of the files as blocks are used.
"""

from __future__ import annotations

import gc
import io
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import psutil
import torch
from torch import nn

HOST_SHARE = 0.8  # read weights into memory only while they take at most this share of what is free
HEADER_LENGTH_BYTES = 8  # a safetensors file starts with its JSON header's length (u64, little endian)
SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}

Home = Literal["memory", "mapped", "device"]


@dataclass(frozen=True)
class HostWeights:
    """What `read_into_memory` did, for the job's memory plan (`memory_plan.host_weights`)."""

    home: Home  # memory: read into the process; mapped: left in the files' map; device: not on the host
    bytes_read: int
    tensors_read: int
    tensors_left: int  # file tensors not read (no same-named CPU tensor of the same dtype and shape)
    reason: str


@dataclass(frozen=True)
class _FileTensor:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int  # absolute byte offset in the file
    nbytes: int


def file_tensors(path: Path) -> list[_FileTensor]:
    """The tensors a safetensors file holds, with their absolute byte ranges (its header only)."""
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(HEADER_LENGTH_BYTES))
        header = json.loads(handle.read(length))
    start = HEADER_LENGTH_BYTES + length
    tensors = []
    for name, entry in header.items():
        if name == "__metadata__" or entry["dtype"] not in SAFETENSORS_DTYPES:
            continue
        begin, end = entry["data_offsets"]
        tensors.append(
            _FileTensor(
                name, SAFETENSORS_DTYPES[entry["dtype"]], tuple(entry["shape"]), start + begin, end - begin
            )
        )
    return tensors


def choose_home(model_bytes: int, available_bytes: int | None = None) -> tuple[Home, str]:
    """'memory' while the model takes at most HOST_SHARE of the host's available memory."""
    available = psutil.virtual_memory().available if available_bytes is None else available_bytes
    if model_bytes <= HOST_SHARE * available:
        return "memory", (
            f"the weights ({model_bytes / 2**30:.2f} GiB) fit in {HOST_SHARE:.0%} of the host's "
            f"available memory ({available / 2**30:.2f} GiB); read into the process"
        )
    return "mapped", (
        f"the weights ({model_bytes / 2**30:.2f} GiB) exceed {HOST_SHARE:.0%} of the host's available "
        f"memory ({available / 2**30:.2f} GiB); left mapped from their files"
    )


def _tensor_slots(model: nn.Module) -> dict[str, list[tuple[nn.Module, str, bool]]]:
    """Every state key of `model` -> the (module, attribute, is_parameter) slots that hold it."""
    slots: dict[str, list[tuple[nn.Module, str, bool]]] = {}
    for prefix, module in model.named_modules(remove_duplicate=False):
        dot = f"{prefix}." if prefix else ""
        for name, parameter in module._parameters.items():
            if parameter is not None:
                slots.setdefault(dot + name, []).append((module, name, True))
        for name, buffer in module._buffers.items():
            if buffer is not None:
                slots.setdefault(dot + name, []).append((module, name, False))
    return slots


def _read(handle: io.FileIO, tensor: _FileTensor) -> torch.Tensor:
    fresh = torch.empty(tensor.shape, dtype=tensor.dtype)
    view = fresh.reshape(-1).view(torch.uint8).numpy().data  # (nbytes,) memoryview of `fresh`
    handle.seek(tensor.offset)
    filled = 0
    while filled < tensor.nbytes:
        count = handle.readinto(view[filled:])
        if not count:
            raise OSError(f"{tensor.name}: the file ends after {filled} of {tensor.nbytes} bytes")
        filled += count
    return fresh


@torch.no_grad()
def read_into_memory(model: nn.Module, folder: Path, reason: str = "") -> HostWeights:
    """Replace every CPU tensor of `model` that a safetensors file in `folder` holds under the same
    name, dtype and shape by a private copy read from the file (see the module docstring). Tied
    parameters stay tied (the shared Parameter gets the new data once)."""
    slots = _tensor_slots(model)
    done: set[int] = set()
    read_bytes = read_count = left = 0
    for path in sorted(folder.glob("*.safetensors")):
        with io.FileIO(path, "r") as handle:
            for tensor in file_tensors(path):
                holders = slots.get(tensor.name, [])
                current = [getattr(module, name) for module, name, _ in holders]
                if current and all(id(held) in done for held in current):
                    continue  # a tied parameter already read under another name
                if not holders or any(
                    t.device.type != "cpu" or t.dtype != tensor.dtype or tuple(t.shape) != tensor.shape
                    for t in current
                ):
                    left += 1
                    continue
                fresh = (
                    _read(handle, tensor) if tensor.nbytes else torch.empty(tensor.shape, dtype=tensor.dtype)
                )
                for (module, name, is_parameter), held in zip(holders, current, strict=True):
                    if id(held) in done:
                        continue
                    if is_parameter:
                        held.data = fresh  # the Parameter object (and any tie to it) is kept
                        done.add(id(held))
                    else:
                        module._buffers[name] = fresh
                read_bytes += tensor.nbytes
                read_count += 1
    gc.collect()  # the replaced views were the map's last owners: it closes now
    return HostWeights("memory", read_bytes, read_count, left, reason)


def mapped_files(folder: Path) -> list[str]:
    """The files under `folder` this process maps right now (Linux /proc/self/maps; [] elsewhere)."""
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return []
    root = str(folder.resolve())
    paths = (line.split()[-1] for line in lines if line.strip())
    return sorted({path for path in paths if path.startswith(root)})
