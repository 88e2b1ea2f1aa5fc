"""Worker-side fixtures, named apart from tests/conftest.py's so neither shadows the other.

They need neither Postgres nor Redis, and a missing data folder skips only the tests that read it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from core.settings import Settings


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """PRUNECAST_DATA_DIR when set, else the workplace's ../shared/data next to the repository."""
    configured = os.environ.get("PRUNECAST_DATA_DIR")
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parents[2].parent / "shared" / "data"


@pytest.fixture
def worker_settings(tmp_path: Path, shared_data_dir: Path) -> Callable[..., Settings]:
    """Settings rooted in this test's tmp_path; keyword arguments override any field."""

    def make(**overrides: object) -> Settings:
        fields: dict[str, object] = {
            "home": tmp_path / "home",
            "cache_dir": tmp_path / "home" / "cache",
            "data_dir": shared_data_dir,
            "model_roots": [tmp_path],
            **overrides,
        }
        return Settings(**fields)  # type: ignore[arg-type]

    return make


@pytest.fixture(scope="session")
def tiny_llama_dir(tiny_model_dir: Path) -> Path:
    """The session's tiny random Llama (tests/conftest.py builds it once for every test)."""
    return tiny_model_dir


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Run the test on one torch intra-op thread, then restore the setting. Tiny-model packages
    (pruning, probing, slicing) use it for every test: there the threads cost more than they save
    and contend with anything else on the machine. Tests on real models keep torch's default."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
