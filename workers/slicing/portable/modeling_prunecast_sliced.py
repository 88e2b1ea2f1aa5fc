"""A per-layer SliceGPT model as a transformers remote-code checkpoint, and the one rebuild both
loaders share.

The per-layer layout (one basis per residual signal, joined by skip matrices) has no stock
transformers form (see `workers.slicing.artifacts`). `save_sliced` therefore copies this file and its
two siblings into every per-layer artifact and writes a config.json of model_type
`prunecast_sliced` whose `auto_map` names the classes below, so that, without prunecast installed,

    AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)

returns the sliced model (a custom model_type, not the dense one, so that loading the folder
WITHOUT remote code fails loudly instead of building a dense model from mismatched weights).
`workers.slicing.artifacts.load_sliced` runs the same `build_sliced_model` without remote code.

What is returned is the family's own stock `*ForCausalLM` class with its blocks wrapped
(`sliced_modules.SkipConnectedBlock`), so `generate()`, KV caches and attention backends are the
ones transformers wrote; `PrunecastSlicedForCausalLM` is only the factory `auto_map` points at.
The config carries the dense model's config (`base_config`) and, under `sliced`, the widths per
signal and the family's declaration (`FamilyAdapter.declaration`): where every part is and how each
branch is called, as data.

Portable: imports torch, safetensors, transformers and the two sibling files only.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
from transformers.utils import cached_file

from .sliced_modules import (
    FamilyLayout,
    ParallelSkipConnectedBlock,
    ProjectedRMSNorm,
    RMSNormNoScale,
    SkipConnectedBlock,
    norm_epsilon,
)
from .sliced_weights import bias_of, set_embedding, set_weight_out_in, weight_out_in

MODEL_TYPE = "prunecast_sliced"
PORTABLE_FILES = ("modeling_prunecast_sliced.py", "sliced_modules.py", "sliced_weights.py")
AUTO_MAP = {
    "AutoConfig": "modeling_prunecast_sliced.PrunecastSlicedConfig",
    "AutoModelForCausalLM": "modeling_prunecast_sliced.PrunecastSlicedForCausalLM",
}


class PrunecastSlicedConfig(PretrainedConfig):
    """config.json of a per-layer sliced checkpoint: the dense config and what slicing changed."""

    model_type = MODEL_TYPE

    def __init__(
        self, base_config: dict[str, Any] | None = None, sliced: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        self.base_config = dict(base_config or {})  # the dense model's config, head untied
        self.sliced = dict(sliced or {})  # {"widths": ..., "adapter": declaration, "weights_file": ...}
        super().__init__(**kwargs)


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Build modules with their parameters on the meta device (no memory) and their buffers real:
    rotary tables are computed at construction and are not in the checkpoint."""
    register = nn.Module.register_parameter

    def register_on_meta(module: nn.Module, name: str, parameter: nn.Parameter | None) -> None:
        register(module, name, parameter)
        if parameter is not None:
            module._parameters[name] = nn.Parameter(
                parameter.to("meta"), requires_grad=parameter.requires_grad
            )

    nn.Module.register_parameter = register_on_meta  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def _empty(shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    return torch.empty(shape, dtype=like.dtype, device="meta")


def _resize(module: nn.Module, rows: int | None, columns: int | None) -> None:
    """Give a linear an empty [rows, columns] weight ([out, in]; None keeps that size) and bias."""
    weight = weight_out_in(module)
    out_width = weight.shape[0] if rows is None else rows
    in_width = weight.shape[1] if columns is None else columns
    set_weight_out_in(module, _empty((out_width, in_width), weight))
    bias = bias_of(module)
    if bias is not None and rows is not None:
        module.bias = nn.Parameter(_empty((rows,), bias), requires_grad=False)


def _ensure_bias(module: nn.Module, name: str, state: dict[str, torch.Tensor]) -> None:
    """Readers of a folded LayerNorm may have gained a bias the dense architecture lacks."""
    if bias_of(module) is None and f"{name}.bias" in state:
        weight = weight_out_in(module)
        module.bias = nn.Parameter(_empty((weight.shape[0],), weight), requires_grad=False)


def replace_block_norms(block: nn.Module, adapter: Any, full_width: int) -> None:
    """Swap the block's norms for weight-free RMSNorms with the same epsilon (one module if shared)."""
    attn_norm, mlp_norm = adapter.attn_norm(block), adapter.mlp_norm(block)
    new_attn_norm = RMSNormNoScale(full_width, norm_epsilon(attn_norm))
    adapter.set_attn_norm(block, new_attn_norm)
    shared = mlp_norm is attn_norm
    adapter.set_mlp_norm(
        block, new_attn_norm if shared else RMSNormNoScale(full_width, norm_epsilon(mlp_norm))
    )


def apply_sliced_structure(
    model: PreTrainedModel, adapter: Any, widths: dict[str, Any], state: dict[str, torch.Tensor]
) -> None:
    """Make a freshly built dense model (parameters on meta) take the sliced model's structure:
    untied head, weight-free norms, sliced shapes, skip-connected blocks, projected branch-output
    norms. `widths` is the width of every signal (`SlicedWidths.to_dict`); `state` (the saved
    tensors) is only consulted for biases that folding added. `adapter` is a `FamilyAdapter` or a
    `FamilyLayout` rebuilt from its declaration."""
    blocks = adapter.blocks(model)
    like = adapter.embeddings(model)[0].weight
    for index, block_widths in enumerate(widths["blocks"]):
        d_in, d_mid, d_out = block_widths["attn_in"], block_widths["mlp_in"], block_widths["out"]
        if adapter.is_parallel(blocks[index]):
            blocks[index] = ParallelSkipConnectedBlock(
                blocks[index], adapter, skip=_empty((d_in, d_out), like)
            )
        else:
            blocks[index] = SkipConnectedBlock(
                blocks[index],
                adapter,
                attn_skip=_empty((d_in, d_mid), like),
                mlp_skip=_empty((d_mid, d_out), like),
            )
    names = {module: name for name, module in model.named_modules()}  # names as in the sliced model

    head = adapter.lm_head(model)
    head.weight = nn.Parameter(_empty((head.out_features, widths["head"]), head.weight), requires_grad=False)
    head.in_features = widths["head"]
    _ensure_bias(head, names[head], state)
    model.config.tie_word_embeddings = False
    for embedding in adapter.embeddings(model):
        set_embedding(embedding, _empty((embedding.num_embeddings, widths["embedding"]), embedding.weight))
    for block, block_widths in zip(blocks, widths["blocks"], strict=True):
        attn_out = (
            block_widths["out"] if isinstance(block, ParallelSkipConnectedBlock) else block_widths["mlp_in"]
        )
        for readers, columns in (
            (adapter.attn_readers(block), block_widths["attn_in"]),
            (adapter.mlp_readers(block), block_widths["mlp_in"]),
        ):
            for reader in readers:
                _resize(reader, None, columns)
                _ensure_bias(reader, names[reader], state)
        for branch, writers, rows in (
            ("attention", adapter.attn_writers(block), attn_out),
            ("mlp", adapter.mlp_writers(block), block_widths["out"]),
        ):
            norm = adapter.output_norm(block, branch)
            if norm is None:
                for writer in writers:
                    _resize(writer, rows, None)
            else:  # the writers keep width D; the norm after them projects onto the kept directions
                projection = _empty((widths["full"], rows), norm.weight)
                adapter.set_output_norm(block, branch, ProjectedRMSNorm(projection, norm_epsilon(norm)))
        replace_block_norms(block, adapter, widths["full"])
    adapter.set_final_norm(model, RMSNormNoScale(widths["full"], norm_epsilon(adapter.final_norm(model))))


def dense_config(base_config: dict[str, Any]) -> PretrainedConfig:
    """The dense model's config object from its dict, head untied."""
    config = CONFIG_MAPPING[base_config["model_type"]].from_dict(dict(base_config))
    config.tie_word_embeddings = False
    return config


def build_sliced_model(
    base_config: dict[str, Any], adapter: Any, widths: dict[str, Any], state: dict[str, torch.Tensor]
) -> PreTrainedModel:
    """The sliced model: the family's stock class built from the dense config with parameters on
    meta, given the sliced structure, then `state` assigned strictly (every key and shape checked)."""
    config = dense_config(base_config)
    with parameters_on_meta():
        model_class: Any = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
        model = model_class(config)
    apply_sliced_structure(model, adapter, widths, state)
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval()


class PrunecastSlicedForCausalLM(PreTrainedModel):
    """What `auto_map` points at: `from_pretrained` builds and returns the sliced model (an instance
    of the family's own class, see the module docstring); this class is never instantiated."""

    config_class = PrunecastSlicedConfig

    @classmethod
    def from_pretrained(  # type: ignore[override]
        cls, pretrained_model_name_or_path: str | Path, *model_args: Any, config: Any = None, **kwargs: Any
    ) -> PreTrainedModel:
        if not isinstance(config, PrunecastSlicedConfig):
            config = PrunecastSlicedConfig.from_pretrained(pretrained_model_name_or_path)
        sliced = config.sliced
        weights = cached_file(str(pretrained_model_name_or_path), sliced["weights_file"])
        assert weights is not None
        state = safetensors.torch.load_file(weights)
        adapter = FamilyLayout.from_declaration(sliced["adapter"])
        model: Any = build_sliced_model(config.base_config, adapter, sliced["widths"], state)
        dtype = kwargs.get("dtype", kwargs.get("torch_dtype"))
        if isinstance(dtype, str) and dtype != "auto":
            dtype = getattr(torch, dtype)
        if isinstance(dtype, torch.dtype):
            model.to(dtype)
        return model
