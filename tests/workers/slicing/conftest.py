"""Slicing tests run tiny models, where torch's intra-op threads cost more than they save (and
contend with anything else on the machine): run them on one thread, then restore the setting."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
