"""What task scorers ask of a model (its context length, whether it wants a BOS, the forward's
argument names across transformers versions) and record of it (device, dtype, versions), with
lm-eval's standard error: shared by log-likelihood scoring, generation and probing.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from typing import Any

import torch
import transformers


def last_logits_only(model: torch.nn.Module) -> dict[str, Any]:
    """Forward arguments that keep only the last position's logits, where the model supports it."""
    return {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}


def cache_argument(model: torch.nn.Module) -> str:
    """transformers 5.x renamed `past_key_values` to `cache`; use whichever the model takes."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def mean_stderr(values: Sequence[float]) -> float | None:
    """lm-eval's mean_stderr: sample standard deviation (n - 1) / sqrt(n); None below two values."""
    n = len(values)
    if n < 2:
        return None
    mean = sum(values) / n
    variance = sum((value - mean) ** 2 for value in values) / (n - 1)
    return math.sqrt(variance) / math.sqrt(n)


def runtime_protocol(model: torch.nn.Module) -> dict[str, Any]:
    """Where and with what a task was scored: device, dtype and library versions."""
    parameters = next(model.parameters())
    return {
        "device": str(parameters.device),
        "dtype": str(parameters.dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def wants_bos(model: torch.nn.Module) -> bool:
    """lm-eval adds no BOS to causal LMs except Gemma, which degrades badly without one."""
    model_type = str(getattr(getattr(model, "config", None), "model_type", ""))
    return model_type.startswith("gemma")


def context_length(model: torch.nn.Module) -> int | None:
    config = getattr(model, "config", None)
    for attribute in ("max_position_embeddings", "n_positions"):
        limit = getattr(config, attribute, None)
        if isinstance(limit, int) and limit > 0:
            return limit
    return None
