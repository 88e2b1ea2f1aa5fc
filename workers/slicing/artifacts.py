"""Saving and loading sliced models.

A sliced model folder holds:
- `model.safetensors`: every parameter and persistent buffer of the sliced model, by its name in
  the sliced module tree (blocks appear as `...layers.<i>.block.*` plus `...layers.<i>.attn_skip`
  and `...layers.<i>.mlp_skip`);
- `config.json`: the dense model's HF config, with `tie_word_embeddings` false;
- `slicing_config.json`: what was sliced and how (family, d per signal, sparsity, source model id
  and revision, calibration details, parameter counts, versions). Written last: a folder without
  it is incomplete.

Why this is not a stock `from_pretrained` checkpoint: SliceGPT gives every block two skip
matrices, so each residual add computes x @ S + branch(x). Stock HF decoder blocks hard-code
x + branch(x), and no config field adds a matrix there; nor can S be folded into neighbouring
weights, because it acts on the residual stream itself. The widths also differ per signal (the
last block writes D while the rest of the stream has d) where an HF config has one hidden_size,
and the weight-free norms divide by the dense width D. (A stock form would exist only if one basis
were shared by every signal, making every S the identity; that is a different, weaker algorithm
than the paper's per-signal PCA, so it is not used.) `load_sliced` therefore rebuilds the dense
architecture from config.json, applies the same structural changes the engine made, and loads
the weights strictly, so every key and shape is checked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from accelerate import init_empty_weights
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from workers.artifact_description import read_description, write_description
from workers.slicing.adapters import FamilyAdapter, adapter_for_family
from workers.slicing.adapters.base import norm_epsilon
from workers.slicing.engine import SlicedWidths, SlicingReport
from workers.slicing.fusion import replace_block_norms
from workers.slicing.modules import ParallelSkipConnectedBlock, RMSNormNoScale, SkipConnectedBlock
from workers.slicing.weights import bias_of, set_embedding, set_weight_out_in, weight_out_in

WEIGHTS_FILE = "model.safetensors"
SLICING_CONFIG_FILE = "slicing_config.json"
FORMAT = "prunecast-slicegpt"
FORMAT_VERSION = 1


def save_sliced(
    model: PreTrainedModel,
    report: SlicingReport,
    folder: str | Path,
    *,
    source_model_id: str,
    revision: str | None,
    calibration: dict[str, Any],
) -> Path:
    """Write a sliced model (as produced by `slice_model`) to `folder`; return the folder.

    `calibration` describes the data the PCAs saw (corpus, split, sequences, seqlen, seed, data
    hash...) and is stored verbatim in slicing_config.json.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {name: tensor.detach().to("cpu").contiguous() for name, tensor in model.state_dict().items()}
    safetensors.torch.save_file(
        state, str(folder / WEIGHTS_FILE), metadata={"format": "pt", "producer": FORMAT}
    )
    model.config.tie_word_embeddings = False
    model.config.save_pretrained(folder)
    description = {
        "method": "slicegpt",
        "family": report.family,
        "hidden_size": report.hidden_size,
        "sparsity": report.sparsity,
        "round_to": report.round_to,
        "slice_head": report.slice_head,
        "widths": report.widths.to_dict(),
        "source_model_id": source_model_id,
        "revision": revision,
        "calibration": calibration,
        "params_before": report.params_before,
        "params_after": report.params_after,
        "param_fraction_removed": report.param_fraction_removed,
        "dtype": report.dtype,
        "weights_file": WEIGHTS_FILE,
    }
    write_description(
        folder / SLICING_CONFIG_FILE, description, file_format=FORMAT, format_version=FORMAT_VERSION
    )
    return folder


def read_slicing_config(folder: str | Path) -> dict[str, Any]:
    """The slicing_config.json of a sliced model folder, checked for format."""
    return read_description(
        folder, SLICING_CONFIG_FILE, file_format=FORMAT, format_version=FORMAT_VERSION, what="sliced model"
    )


def load_sliced(folder: str | Path, *, device: torch.device | str = "cpu") -> PreTrainedModel:
    """Rebuild a sliced model saved by `save_sliced`; its logits equal the saved model's."""
    folder = Path(folder)
    description = read_slicing_config(folder)
    config = AutoConfig.from_pretrained(folder)
    with init_empty_weights(include_buffers=False):  # parameters on meta; buffers (rotary tables) real
        model = AutoModelForCausalLM.from_config(config)
    adapter = adapter_for_family(description["family"])
    if not adapter.matches(model):
        raise ValueError(f"config.json in {folder} does not build a {adapter.name}-family model")
    state = safetensors.torch.load_file(str(folder / description["weights_file"]), device=str(device))
    apply_sliced_structure(model, adapter, SlicedWidths.from_dict(description["widths"]), state)
    model.load_state_dict(state, strict=True, assign=True)
    model.to(device)
    return model.eval()


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


def apply_sliced_structure(
    model: PreTrainedModel, adapter: FamilyAdapter, widths: SlicedWidths, state: dict[str, torch.Tensor]
) -> None:
    """Make a freshly built dense model (parameters on meta) take the sliced model's structure:
    untied head, weight-free norms, sliced shapes, skip-connected blocks. `state` (the saved
    tensors) is only consulted for biases that folding added."""
    blocks = adapter.blocks(model)
    like = adapter.embeddings(model)[0].weight
    for index, block_widths in enumerate(widths.blocks):
        if adapter.is_parallel(blocks[index]):
            skip = _empty((block_widths.attn_in, block_widths.out), like)
            blocks[index] = ParallelSkipConnectedBlock(blocks[index], adapter, skip=skip)
        else:
            attn_skip = _empty((block_widths.attn_in, block_widths.mlp_in), like)
            mlp_skip = _empty((block_widths.mlp_in, block_widths.out), like)
            blocks[index] = SkipConnectedBlock(blocks[index], adapter, attn_skip=attn_skip, mlp_skip=mlp_skip)
    names = {module: name for name, module in model.named_modules()}  # names as in the sliced model

    head = adapter.lm_head(model)
    head.weight = nn.Parameter(_empty((head.out_features, widths.head), head.weight), requires_grad=False)
    head.in_features = widths.head
    _ensure_bias(head, names[head], state)
    model.config.tie_word_embeddings = False
    for embedding in adapter.embeddings(model):
        set_embedding(embedding, _empty((embedding.num_embeddings, widths.embedding), embedding.weight))
    for block, block_widths in zip(blocks, widths.blocks, strict=True):
        for reader in adapter.attn_readers(block):
            _resize(reader, None, block_widths.attn_in)
            _ensure_bias(reader, names[reader], state)
        attn_out = block_widths.out if isinstance(block, ParallelSkipConnectedBlock) else block_widths.mlp_in
        for writer in adapter.attn_writers(block):
            _resize(writer, attn_out, None)
        for reader in adapter.mlp_readers(block):
            _resize(reader, None, block_widths.mlp_in)
            _ensure_bias(reader, names[reader], state)
        for writer in adapter.mlp_writers(block):
            _resize(writer, block_widths.out, None)
        replace_block_norms(block, adapter, widths.full)
    adapter.set_final_norm(model, RMSNormNoScale(widths.full, norm_epsilon(adapter.final_norm(model))))
