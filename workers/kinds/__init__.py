"""One handler per job kind. A handler reads its validated request from the context, does the
work, reports progress and stores results; it raises JobFailure for user-facing errors."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from workers.context import JobContext, JobFailure

Handler = Callable[[JobContext], None]

# kind -> module defining `run(context)`; imported lazily so that torch loads inside the job.
HANDLER_MODULES = {
    "evaluate": "workers.kinds.evaluate",
    "prune": "workers.kinds.prune",
    "sweep": "workers.kinds.sweep",
    "probe": "workers.kinds.probe",
    "profile": "workers.kinds.profile",
    "simulate": "workers.kinds.simulate",
}
# Kinds whose handler resumes from what an earlier attempt stored; every other kind starts over,
# and what its earlier attempts stored is discarded first.
RESUMING_KINDS = frozenset({"sweep"})


def handler_for(kind: str) -> Handler:
    module_name = HANDLER_MODULES.get(kind)
    if module_name is None:
        raise JobFailure(
            f"job kind {kind!r} is not supported by this worker; known: {sorted(HANDLER_MODULES)}"
        )
    run: Handler = importlib.import_module(module_name).run
    return run
