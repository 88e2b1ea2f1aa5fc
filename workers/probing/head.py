"""The final norm and LM head read in float32, whatever the model's dtype (docs/science.md §3).

Probability-space deviations of a pruned model are often tiny (KL ~1e-5), far below what logits
rounded to bfloat16 can resolve: a bf16 logit of size ~10 is off by ~0.02, which alone puts a floor
of ~1e-4 under any KL. So every probe reads the final hidden state (exactly the model's, in its own
dtype) through a float32 copy of the final norm and through the head's weight cast to float32 a
slice of the vocabulary at a time, so that a 128k-token vocabulary never needs a whole float32 copy
of the head (VOCAB_CHUNK rows x D at a time); a head already in float32 is read in one GEMM.
Logit soft-capping (Gemma-2) is applied as the model applies it. A test checks that in float32
this equals the model's own logits, and that in bf16 it removes the floor.

The `released-code` probe convention (`core.probe_conventions`) reads otherwise, as the authors'
code does: `NativeHead` applies the head in the model's own dtype, at the output after the final
norm (the model's own logits), at intermediate layers straight to the hidden state (no final norm).
`lens_head` and `output_head` pick the reader a convention asks for.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from core.probe_conventions import PRUNECAST, ProbeConvention
from workers.architectures import FamilyAdapter

VOCAB_CHUNK = 16_384  # head rows cast to float32 at once: 16k x 4096 x 4 B = 256 MB at most


class Float32Head:
    """hidden (n, D) in any dtype -> logits (n, V) float32, on the head's device."""

    def __init__(self, adapter: FamilyAdapter, model: nn.Module, device: torch.device | None = None) -> None:
        head = adapter.lm_head(model)
        self.device = head.weight.device if device is None else device
        self.norm = _without_hooks(copy.deepcopy(adapter.final_norm(model))).to(
            device=self.device, dtype=torch.float32
        )
        self.weight = head.weight.detach()  # (V, D), left in the model's dtype and place
        self.bias = None if head.bias is None else head.bias.detach()
        config = getattr(model, "config", None)
        self.softcap = getattr(config, "final_logit_softcapping", None)

    @property
    def vocab(self) -> int:
        return int(self.weight.shape[0])

    @torch.no_grad()
    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        normed = self.norm(hidden.to(device=self.device, dtype=torch.float32))  # (n, D)
        return self.capped(self.linear(normed, with_bias=True))

    @torch.no_grad()
    def linear(self, normed: torch.Tensor, with_bias: bool) -> torch.Tensor:
        """normed (n, D) float32 -> W normed (+ b) (n, V) float32: one GEMM when the head already
        is float32 on the device, otherwise a vocabulary slice cast at a time."""
        if self.weight.dtype == torch.float32 and self.weight.device == self.device:
            bias = self.bias.to(self.device, torch.float32) if with_bias and self.bias is not None else None
            return nn.functional.linear(normed, self.weight, bias)
        logits = torch.empty((normed.shape[0], self.vocab), dtype=torch.float32, device=self.device)
        for start in range(0, self.vocab, VOCAB_CHUNK):
            rows = slice(start, min(start + VOCAB_CHUNK, self.vocab))
            weight = self.weight[rows].to(device=self.device, dtype=torch.float32)  # (c, D)
            bias = None
            if with_bias and self.bias is not None:
                bias = self.bias[rows].to(device=self.device, dtype=torch.float32)
            logits[:, rows] = nn.functional.linear(normed, weight, bias)
        return logits

    def capped(self, logits: torch.Tensor) -> torch.Tensor:
        """The model's logit soft-capping (Gemma-2), if it has one."""
        if self.softcap:
            return torch.tanh(logits / self.softcap) * self.softcap
        return logits


class NativeHead:
    """hidden (n, D) -> logits (n, V) read in the model's dtype (returned as float32 for the deviation
    math), with or without the final norm: how the authors' released code reads them."""

    def __init__(
        self,
        adapter: FamilyAdapter,
        model: nn.Module,
        device: torch.device | None = None,
        *,
        final_norm: bool,
    ) -> None:
        head = adapter.lm_head(model)
        self.weight = head.weight.detach()  # (V, D) in the model's dtype
        self.bias = None if head.bias is None else head.bias.detach()
        self.device = self.weight.device if device is None else device
        self.norm = (
            _without_hooks(copy.deepcopy(adapter.final_norm(model))).to(self.weight.device)
            if final_norm
            else None
        )
        config = getattr(model, "config", None)
        # soft-capping belongs to the model's own logits, not to a bare lm_head reading
        self.softcap = getattr(config, "final_logit_softcapping", None) if final_norm else None

    @property
    def vocab(self) -> int:
        return int(self.weight.shape[0])

    @torch.no_grad()
    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        x = hidden.to(device=self.weight.device, dtype=self.weight.dtype)  # (n, D)
        if self.norm is not None:
            x = self.norm(x)
        logits = nn.functional.linear(x, self.weight, self.bias)  # (n, V) in the model's dtype
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits.to(device=self.device, dtype=torch.float32)


LogitReader = Float32Head | NativeHead


def lens_head(
    adapter: FamilyAdapter, model: nn.Module, convention: ProbeConvention = PRUNECAST
) -> LogitReader:
    """The reader of intermediate hidden states (the logit lens of a layer) under `convention`."""
    if convention.float32_head:
        if not convention.lens_final_norm:
            raise ValueError(f"convention {convention.name!r}: no float32 reader without the final norm")
        return Float32Head(adapter, model)
    return NativeHead(adapter, model, final_norm=convention.lens_final_norm)


def output_head(
    adapter: FamilyAdapter,
    model: nn.Module,
    device: torch.device | None = None,
    convention: ProbeConvention = PRUNECAST,
) -> LogitReader:
    """The reader of the final hidden state (the model's next-token logits) under `convention`."""
    if convention.float32_head:
        return Float32Head(adapter, model, device)
    return NativeHead(adapter, model, device, final_norm=True)


def _without_hooks(module: nn.Module) -> nn.Module:
    """A copied module keeps the hooks of the original (a probe's capture hook on the final norm):
    the copy must not fire them."""
    for part in module.modules():
        part._forward_hooks.clear()
        part._forward_pre_hooks.clear()
    return module
