"""Pruning tests run tiny models, where torch's intra-op threads cost more than they save (and
contend with anything else on the machine): run them on one thread, then restore the setting."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _one_torch_thread(one_torch_thread: None) -> None:
    """Every test here runs on one torch thread (tests/workers/conftest.py)."""
