"""The dtype per-layer slicing's basis streams run in, where the job does not say.

Why bfloat16 by default where the device computes it natively (bench/README.md, `basis_windows.py`,
SmolLM2-135M, five sparsities): the streams only feed second moments, summed in float64, whose top
directions are the bases, and bfloat16 rounding barely moves them. Bases from every calibration
window in bfloat16 gave the float32 every-window curve within 0.0047 median / 0.0095 max in ln PPL,
for 0.54x the streams' seconds; from three quarters of the windows 0.025 / 0.036 against
float32's 0.029 / 0.054, for 0.53x. The rule was fixed on SmolLM2 before Gemma ran. Bfloat16
streams now take every window by default (`SimulateJobCreate.sequential_windows`), still cheaper
than float32's three quarters. The model, the evaluation windows and an anchor's stream (the
method itself) stay in the job's dtype. Where bfloat16 is emulated (a CPU without AVX512-BF16 or
AMX, a GPU before Ampere) it would cost more, so the streams keep the model's dtype there.
"""

from __future__ import annotations

import torch

CHEAP_STREAMS_DTYPE = torch.bfloat16


def computes_bfloat16_natively(device: torch.device) -> bool:
    """Whether `device` multiplies bfloat16 in hardware (so it is cheaper than float32 there)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type == "cpu":
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    return False


def resolve_streams_dtype(
    asked: str | None, model_dtype: torch.dtype, device: torch.device
) -> torch.dtype | None:
    """The streams' dtype where it differs from the model's (None: the model's own). `asked` is the
    job's `basis_dtype`; null picks bfloat16 for a float32 model on a device that computes it
    natively, and the model's dtype otherwise."""
    if asked is not None:
        wanted = getattr(torch, asked)
    elif model_dtype == torch.float32 and computes_bfloat16_natively(device):
        wanted = CHEAP_STREAMS_DTYPE
    else:
        return None
    return None if wanted == model_dtype else wanted
