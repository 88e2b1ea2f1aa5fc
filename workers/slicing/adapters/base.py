"""The small interface every model family implements for the SliceGPT engine.

An adapter answers, for one family: where the embeddings (token and learned positions), the
decoder blocks, the final norm and the LM head are; inside a block, which norm precedes attention
and which linears read it, which linears write the attention output into the residual stream, and
the same for the MLP; whether the norms are LayerNorm (the model needs mean removal first) or
RMSNorm; whether blocks are sequential or parallel-residual; and how to run the attention and
MLP branches of a block. Everything structural is declared as dotted module paths; only the
branch calls are code. Adding a family means adding one subclass and listing it in
`workers.slicing.adapters.ADAPTERS`.

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
    RMSNormNoScale,
    WrappedBlock,
    get_path,
    norm_epsilon,
    run_attention,
    run_mlp,
    set_path,
)
from workers.slicing.portable.sliced_weights import ReadWriteModule


def unwrap(block: nn.Module) -> nn.Module:
    """The original decoder block, whether or not it is wrapped for skip connections."""
    return block.block if isinstance(block, WrappedBlock) else block


def config_dict(model: PreTrainedModel) -> dict[str, Any]:
    """The model's config as a dict, naming the model class when `architectures` is unset."""
    config: dict[str, Any] = model.config.to_dict()
    if not config.get("architectures"):  # models built from a config carry no architectures entry
        config["architectures"] = [type(model).__name__]
    return config


class FamilyAdapter(ABC):
    """Where things are in one family's models, and how to run a block's two branches."""

    name: ClassVar[str]  # family name, as in core.families
    uses_layernorm: ClassVar[bool]  # LayerNorm (mean removal needed) rather than RMSNorm

    # Paths relative to the *ForCausalLM model.
    decoder_path: ClassVar[str]  # the module that owns embeddings, blocks and final norm
    blocks_path: ClassVar[str]  # nn.ModuleList of decoder blocks
    embedding_paths: ClassVar[tuple[str, ...]]  # token embedding first, then learned positions
    final_norm_path: ClassVar[str]
    head_path: ClassVar[str] = "lm_head"

    # Paths relative to one decoder block.
    attn_norm_path: ClassVar[str]
    attn_reader_paths: ClassVar[tuple[str, ...]]  # linears reading the attention norm's output
    attn_writer_paths: ClassVar[tuple[str, ...]]  # linears adding the attention output to the stream
    mlp_norm_path: ClassVar[str]
    mlp_reader_paths: ClassVar[tuple[str, ...]]
    mlp_writer_paths: ClassVar[tuple[str, ...]]
    block_children: ClassVar[frozenset[str]]  # every direct child a block of this family may have

    # How a block's branches are called (`portable.sliced_modules.run_attention` / `run_mlp`); data,
    # so that an exported checkpoint rebuilds the same calls without this code (`declaration`).
    attention_path: ClassVar[str] = "self_attn"
    attention_by_name: ClassVar[bool] = True  # hidden_states= rather than positional
    attention_ignored: ClassVar[tuple[str, ...]] = ()  # block call arguments the attention does not take
    attention_dropout_path: ClassVar[str | None] = None
    mlp_chain: ClassVar[tuple[str, ...]] = ("mlp",)
    mlp_dropout_path: ClassVar[str | None] = None
    parallel_attribute: ClassVar[str | None] = None  # block attribute that says parallel, if it varies
    parallel_default: ClassVar[bool] = False

    # ---- residual structure and the two calls that differ between families --------------------

    def is_parallel(self, block: nn.Module) -> bool:
        """True if attention and MLP both read the block input (y = x + attn(x) + mlp(x)):
        such a block has one input basis, one output basis and one skip matrix. Sequential
        blocks (h = x + attn(x); y = h + mlp(h)) have a basis between attention and MLP too."""
        if self.parallel_attribute is None:
            return self.parallel_default
        return bool(getattr(unwrap(block), self.parallel_attribute, self.parallel_default))

    def attention_branch(self, block: nn.Module, normed: torch.Tensor, call: dict[str, Any]) -> torch.Tensor:
        """What the block adds to the residual for attention, given the attention norm's output and
        the block's call arguments by name (attention mask, position info, cache...)."""
        return run_attention(
            unwrap(block),
            normed,
            call,
            path=self.attention_path,
            by_name=self.attention_by_name,
            ignored=self.attention_ignored,
            dropout_path=self.attention_dropout_path,
        )

    def mlp_branch(self, block: nn.Module, normed: torch.Tensor) -> torch.Tensor:
        """What the block adds to the residual for the MLP, given the MLP norm's output."""
        return run_mlp(unwrap(block), normed, chain=self.mlp_chain, dropout_path=self.mlp_dropout_path)

    def declaration(self) -> dict[str, Any]:
        """Everything structural about this family as plain data: what an exported checkpoint's
        `DeclaredAdapter` needs to find and call every part without this code."""
        names = [
            "name",
            "decoder_path",
            "blocks_path",
            "embedding_paths",
            "final_norm_path",
            "head_path",
            "attn_norm_path",
            "attn_reader_paths",
            "attn_writer_paths",
            "mlp_norm_path",
            "mlp_reader_paths",
            "mlp_writer_paths",
            "attention_path",
            "attention_by_name",
            "attention_ignored",
            "attention_dropout_path",
            "mlp_chain",
            "mlp_dropout_path",
            "parallel_attribute",
            "parallel_default",
        ]
        return {name: getattr(self, name) for name in names}

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
            for norm in (self.attn_norm(block), self.mlp_norm(block)):
                reason = self.norm_problem(norm)
                if reason is not None:
                    return unsupported_message(config, f"block {index}: {reason}")
        reason = self.norm_problem(self.final_norm(model))
        return None if reason is None else unsupported_message(config, f"final norm: {reason}")

    def norm_problem(self, norm: nn.Module) -> str | None:
        """Check that a norm computes what folding assumes, by running it on a probe vector."""
        if isinstance(norm, RMSNormNoScale):
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
            expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
        mismatch = float(
            (got - expected).norm() / torch.maximum(got.norm(), expected.norm()).clamp_min(1e-12)
        )
        tolerance = 1e-4 if weight.dtype in (torch.float32, torch.float64) else 2e-2
        if not mismatch <= tolerance:
            return (
                f"{type(norm).__name__} does not compute weight * x / rms(x) (relative error "
                f"{mismatch:.2g}; Gemma-style (1 + weight) scaling, for example), so it cannot be folded"
            )
        return None

    # ---- accessors ----------------------------------------------------------------------------

    def decoder(self, model: nn.Module) -> nn.Module:
        return get_path(model, self.decoder_path)

    def blocks(self, model: nn.Module) -> nn.ModuleList:
        return get_path(model, self.blocks_path)

    def embeddings(self, model: nn.Module) -> list[nn.Embedding]:
        return [get_path(model, path) for path in self.embedding_paths]

    def final_norm(self, model: nn.Module) -> nn.Module:
        return get_path(model, self.final_norm_path)

    def set_final_norm(self, model: nn.Module, norm: nn.Module) -> None:
        set_path(model, self.final_norm_path, norm)

    def lm_head(self, model: nn.Module) -> nn.Linear:
        return get_path(model, self.head_path)

    def attn_norm(self, block: nn.Module) -> nn.Module:
        return get_path(unwrap(block), self.attn_norm_path)

    def mlp_norm(self, block: nn.Module) -> nn.Module:
        return get_path(unwrap(block), self.mlp_norm_path)

    def set_attn_norm(self, block: nn.Module, norm: nn.Module) -> None:
        set_path(unwrap(block), self.attn_norm_path, norm)

    def set_mlp_norm(self, block: nn.Module, norm: nn.Module) -> None:
        set_path(unwrap(block), self.mlp_norm_path, norm)

    def attn_readers(self, block: nn.Module) -> list[nn.Module]:
        return [get_path(unwrap(block), path) for path in self.attn_reader_paths]

    def attn_writers(self, block: nn.Module) -> list[nn.Module]:
        return [get_path(unwrap(block), path) for path in self.attn_writer_paths]

    def mlp_readers(self, block: nn.Module) -> list[nn.Module]:
        return [get_path(unwrap(block), path) for path in self.mlp_reader_paths]

    def mlp_writers(self, block: nn.Module) -> list[nn.Module]:
        return [get_path(unwrap(block), path) for path in self.mlp_writer_paths]

    def norm_scale_shift(self, norm: nn.Module) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(scale a, shift b) of a norm: y = normalise(x) * a + b. None where absent."""
        scale = getattr(norm, "weight", None)
        shift = getattr(norm, "bias", None) if self.uses_layernorm else None
        return scale, shift
