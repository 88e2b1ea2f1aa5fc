"""What a result was computed with: recorded beside every job and result."""

from __future__ import annotations

import platform
import socket
from typing import Any

import torch
import transformers


def run_environment(device: torch.device) -> dict[str, Any]:
    environment: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": str(device),
        "host": socket.gethostname(),
    }
    if device.type == "cuda":
        environment["device_name"] = torch.cuda.get_device_name(device)
    return environment
