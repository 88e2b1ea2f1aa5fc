"""What a result was computed with: recorded beside every job and result."""

from __future__ import annotations

import platform
import socket
from typing import Any

import torch
import transformers

from workers.offload import MemoryPlan


def run_environment(device: torch.device, memory_plan: MemoryPlan | None = None) -> dict[str, Any]:
    """Versions, device and host; with `memory_plan`, where the model lived (whole or offloaded)."""
    environment: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": str(device),
        "host": socket.gethostname(),
    }
    if device.type == "cuda":
        environment["device_name"] = torch.cuda.get_device_name(device)
    if memory_plan is not None:
        environment["memory_plan"] = memory_plan.record()
    return environment
