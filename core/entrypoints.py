"""How the service side reaches the engine without importing it: by name, the way RQ does.

The API never imports `workers` (it never loads torch; a test guards it). It names the job
function when it enqueues on RQ, and the in-process worker of the embedded deployment and the
`prunecast worker` command resolve the same names at run time. These are the only places the
HTTP side refers to the engine, and they are all here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

JOB_FUNCTION = "workers.tasks.run_job"
"""What an RQ worker calls with a job id (a forked work horse: opens its own store)."""
EMBEDDED_JOB_FUNCTION = "workers.tasks.execute_job"
"""What the embedded deployment's worker thread calls with its store, settings and a job id."""
WORKER_COMMAND = "workers.cli.main"
"""`prunecast worker ...`: the RQ worker process, which lives on the engine side."""


def resolve(name: str) -> Callable[..., Any]:
    """The function a dotted `module.function` name refers to (imported on first use)."""
    module_name, _, attribute = name.rpartition(".")
    function: Callable[..., Any] = getattr(importlib.import_module(module_name), attribute)
    return function
