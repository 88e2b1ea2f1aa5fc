"""Model names resolve to a source, or to an error that says how to fix them, without torch."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.model_sources import ModelSourceError, resolve_model
from core.settings import Settings


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path / "home", model_roots=[tmp_path / "models"])


def test_packaged_alias_resolves_to_the_shipped_gguf(settings: Settings) -> None:
    source = resolve_model("smollm2-135m", settings)
    assert source.kind == "packaged" and source.model_id == "smollm2-135m"
    assert source.path.is_file() and source.gguf_file == "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_local_folder_below_a_root_resolves_with_its_config(settings: Settings, tmp_path: Path) -> None:
    folder = tmp_path / "models" / "m"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "llama"}')
    source = resolve_model(str(folder), settings)
    assert source.kind == "local" and source.config == {"model_type": "llama"}


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("", "must not be empty"),
        ("~root/models", "outside the configured model roots"),
        ("/tmp/\x00evil", "not a usable path"),
        ("a/b/c", "outside the configured model roots"),
        ("org/name", "not in the local Hugging Face cache"),
        ("no spaces please", "neither a packaged alias"),
    ],
)
def test_unusable_names_give_readable_errors(settings: Settings, name: str, fragment: str) -> None:
    with pytest.raises(ModelSourceError, match=fragment):
        resolve_model(name, settings)


def test_local_paths_need_configured_roots(tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError, match="PRUNECAST_MODEL_ROOTS"):
        resolve_model(str(tmp_path), Settings(home=tmp_path))


def test_folder_without_config_or_with_bad_json_is_refused(settings: Settings, tmp_path: Path) -> None:
    folder = tmp_path / "models" / "empty"
    folder.mkdir(parents=True)
    with pytest.raises(ModelSourceError, match=r"no config\.json"):
        resolve_model(str(folder), settings)
    (folder / "config.json").write_text("[1, 2")
    with pytest.raises(ModelSourceError, match="unreadable"):
        resolve_model(str(folder), settings)
