"""Giving freed host memory back to the system between an engine's passes.

torch allocates CPU tensors with malloc. glibc serves a request of at least its mmap threshold with
a private mapping, returned to the system on free, and anything smaller from its heaps, which keep
what is freed. The threshold adapts: every freed mapping raises it to that size (up to 32 MiB), so
after the first few freed activations every later one of 1-32 MiB (a calibration batch's hidden
states, an MLP's activations, a rotated weight) comes from the heaps. Freed in another order than
allocated, they fragment the heaps, which keep growing: slicing SmolLM2-135M on 128 x 512 windows
ended 740 MiB above what it held (docs/architecture.md, "Memory").

Two remedies were measured on slicing (bench/README.md, "slicing_vs_reference.py"): a fixed 1 MiB
threshold (every large tensor mapped and unmapped) kept the least memory but cost 43 % more wall
time, in page faults; `release_free_memory` between passes (glibc `malloc_trim`, which also frees
pages in the middle of a heap) kept nearly as little for 7-10 % (one run each at 32 x 512). The
engines use the second. It does nothing off glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any


@functools.cache
def _glibc() -> Any | None:
    """The C library when it has glibc's malloc_trim, else None."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        _ = libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    return libc


def release_free_memory() -> None:
    """Give the heaps' free pages back to the system, wherever in the heap they are. Called between
    passes over the calibration stream, when a pass's activations have just been freed; it costs the
    page faults of touching that memory again."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
