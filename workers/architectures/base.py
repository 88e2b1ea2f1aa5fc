"""The small interface every model family implements for the SliceGPT engine.

An adapter answers, for one family: where the embeddings (token and learned positions), the
decoder blocks, the final norm and the LM head are; inside a block, which norm precedes attention
and which linears read it, which linears write the attention output into the residual stream, and
the same for the MLP; whether the norms are LayerNorm (the model needs mean removal first) or
RMSNorm; whether blocks are sequential or parallel-residual; and how to run the attention and
MLP branches of a block. All of that is data (`portable.sliced_modules.FamilyLayout`: dotted
module paths and a few flags), which exported checkpoints carry too; code is left only where a
family's forward needs it (OPT's functional dropout, GPT-2's cross-attention refusal). Adding a
family means adding one subclass and listing it in `workers.architectures.ADAPTERS`.

Adapters are recognised from a loaded model's module structure (`matches`) and checked against
its config and norm behaviour (`problems`), never from the model's name.
"""

from __future__ import annotations

from abc import ABC
from typing import Any, ClassVar

import torch
from torch import nn
from transformers import PreTrainedModel

from core.families import family_config_refusal, unsupported_message
from workers.slicing.portable.sliced_modules import (
    BRANCHES,
    FamilyLayout,
    ProjectedRMSNorm,
    RMSNormNoScale,
    get_path,
    norm_epsilon,
    unwrap,
)
from workers.slicing.portable.sliced_weights import ReadWriteModule


def config_dict(model: PreTrainedModel) -> dict[str, Any]:
    """The model's config as a dict, naming the model class when `architectures` is unset."""
    config: dict[str, Any] = model.config.to_dict()
    if not config.get("architectures"):  # models built from a config carry no architectures entry
        config["architectures"] = [type(model).__name__]
    return config


class FamilyAdapter(FamilyLayout, ABC):
    """Where things are in one family's models and how to run a block's two branches (the
    `FamilyLayout` data its subclasses declare), plus what only the engine needs: recognising the
    family and checking that its norms can be folded."""

    uses_layernorm: ClassVar[bool]  # LayerNorm (mean removal needed) rather than RMSNorm
    block_children: ClassVar[frozenset[str]]  # every direct child a block of this family may have
    # What a norm's weight adds to 1 in its scale: 0 for weight * x / rms(x), 1 for Gemma's
    # (1 + weight) * x / rms(x).
    norm_scale_offset: ClassVar[float] = 0.0

    def branch_outputs(self, block: nn.Module, branch: str) -> list[nn.Module]:
        """The modules whose outputs sum to what `branch` ("attention" or "mlp") adds to the stream:
        its output norm where the family has one, else its writers."""
        norm = self.output_norm(block, branch)
        if norm is not None:
            return [norm]
        return self.writers(block, branch)

    # ---- recognition --------------------------------------------------------------------------

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        """True if the model has this family's module structure (names and module types)."""
        blocks = get_path(model, cls.blocks_path)
        if not isinstance(blocks, nn.ModuleList) or len(blocks) == 0:
            return False
        if not all(isinstance(get_path(model, path), nn.Embedding) for path in cls.embedding_paths):
            return False
        if not isinstance(get_path(model, cls.head_path), nn.Linear):
            return False
        if not isinstance(get_path(model, cls.final_norm_path), nn.Module):
            return False
        for wrapped in blocks:
            block = unwrap(wrapped)
            linears = (
                cls.attn_reader_paths + cls.attn_writer_paths + cls.mlp_reader_paths + cls.mlp_writer_paths
            )
            if not all(isinstance(get_path(block, path), ReadWriteModule) for path in linears):
                return False
            if not all(
                isinstance(get_path(block, path), nn.Module)
                for path in (cls.attn_norm_path, cls.mlp_norm_path)
            ):
                return False
        return True

    def problems(self, model: PreTrainedModel) -> str | None:
        """Why this matching model still cannot be sliced (config details, extra modules in its
        blocks, norms that do not compute what the family's norm computes), or None."""
        config = config_dict(model)
        refusal = family_config_refusal(self.name, config)
        if refusal is not None:
            return refusal
        for index, wrapped in enumerate(self.blocks(model)):
            block = unwrap(wrapped)
            extra = sorted(set(dict(block.named_children())) - self.block_children)
            if extra:
                return unsupported_message(
                    config,
                    f"block {index} has modules the {self.name} adapter does not account for "
                    f"({', '.join(extra)}); slicing would leave them out of the rotation",
                )
            output_norms = [self.output_norm(block, branch) for branch in BRANCHES]
            for norm in [self.attn_norm(block), self.mlp_norm(block)] + [n for n in output_norms if n]:
                reason = self.norm_problem(norm)
                if reason is not None:
                    return unsupported_message(config, f"block {index}: {reason}")
        reason = self.norm_problem(self.final_norm(model))
        return None if reason is None else unsupported_message(config, f"final norm: {reason}")

    def norm_problem(self, norm: nn.Module) -> str | None:
        """Check that a norm computes what folding assumes, by running it on a probe vector."""
        if isinstance(norm, RMSNormNoScale | ProjectedRMSNorm):
            return None  # already fused (or sliced): recognised, though not sliceable again
        if self.uses_layernorm:
            return None if isinstance(norm, nn.LayerNorm) else f"{type(norm).__name__} is not a LayerNorm"
        weight = getattr(norm, "weight", None)
        if (
            not isinstance(weight, torch.Tensor)
            or weight.dim() != 1
            or getattr(norm, "bias", None) is not None
        ):
            return f"{type(norm).__name__} is not an RMSNorm with one scale vector"
        try:
            eps = norm_epsilon(norm)
        except ValueError as missing:
            return str(missing)
        if weight.is_meta:
            return None
        generator = torch.Generator().manual_seed(0)
        probe = torch.randn(4, weight.numel(), generator=generator).to(
            device=weight.device, dtype=weight.dtype
        )
        with torch.no_grad():
            got = norm(probe).float()
            x = probe.float()
            scale = weight.float() + self.norm_scale_offset
            expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * scale
        mismatch = float(
            (got - expected).norm() / torch.maximum(got.norm(), expected.norm()).clamp_min(1e-12)
        )
        tolerance = 1e-4 if weight.dtype in (torch.float32, torch.float64) else 2e-2
        if not mismatch <= tolerance:
            formula = "(1 + weight) * x / rms(x)" if self.norm_scale_offset else "weight * x / rms(x)"
            example = "" if self.norm_scale_offset else "; Gemma-1's (1 + weight) scaling, for example"
            return (
                f"{type(norm).__name__} does not compute {formula} (relative error {mismatch:.2g}"
                f"{example}), so it cannot be folded"
            )
        return None

    def norm_scale_shift(self, norm: nn.Module) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(scale a, shift b) of a norm: y = normalise(x) * a + b. None where absent."""
        scale = getattr(norm, "weight", None)
        if scale is not None and self.norm_scale_offset:
            scale = scale.float() + self.norm_scale_offset
        shift = getattr(norm, "bias", None) if self.uses_layernorm else None
        return scale, shift
