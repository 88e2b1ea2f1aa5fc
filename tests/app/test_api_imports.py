"""The API process never loads torch: it starts fast and its image stays small (DESIGN.md)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO_ROOT

HEAVY = ("torch", "transformers", "safetensors", "accelerate")


def test_importing_the_app_loads_no_torch_or_transformers() -> None:
    script = (
        "import sys, app.main, app.routes.jobs, app.schemas\n"
        "app.main.create_app\n"
        f"print(','.join(name for name in {HEAVY!r} if name in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "", f"the API imported {done.stdout.strip()}"
