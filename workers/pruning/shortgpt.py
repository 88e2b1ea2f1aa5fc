"""ShortGPT (Men et al., 2024): remove the decoder blocks that change the residual stream least.

Block Influence BI_l = 1 - mean over calibration tokens of cos(h_in, h_out), on the dense model in
one pass (padded positions excluded). The n blocks with the lowest BI are removed from the
ModuleList. The result stays a stock transformers model: the config's layer count (and its
per-layer `layer_types` list where the family has one) shrinks to match, and every attention
module's `layer_idx` is renumbered so the KV cache indexes the remaining layers. It saves with
`save_pretrained` and loads with `AutoModelForCausalLM.from_pretrained`.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel

from workers.architectures import FamilyAdapter
from workers.block_inputs import BlockBatch
from workers.pruning.stream import ProgressCallback, StopCheck, run_block, token_cosines, walk_blocks
from workers.slicing.portable.sliced_modules import set_path

PER_LAYER_CONFIG_LISTS = ("layer_types",)  # config fields holding one entry per layer


@torch.no_grad()
def block_influence(
    blocks: nn.ModuleList,
    batches: list[BlockBatch],
    *,
    compute: torch.device,
    progress: ProgressCallback | None = None,
    should_stop: StopCheck | None = None,
) -> list[float]:
    """BI per dense block; `batches` end at the last block's output."""
    influence: list[float] = []
    home = batches[0].hidden.device
    for index, block in walk_blocks(
        blocks, compute=compute, home=home, progress=progress, should_stop=should_stop
    ):
        cosine_sum, tokens = 0.0, 0
        for batch in batches:
            x = batch.hidden.to(compute)  # (B, T, D)
            y = run_block(block, index, batch, compute)  # (B, T, D)
            cosine_sum += float(token_cosines(x, y, batch.keep).sum())
            tokens += int(batch.keep.sum())
            batch.hidden = y.to(home)
        influence.append(1.0 - cosine_sum / tokens)
    return influence


# Config flags under which a block computes something that depends on its index: renumbering the
# kept blocks after a removal would change them when the saved checkpoint is loaded again.
INDEX_DEPENDENT_FLAGS = ("scale_attn_by_inverse_layer_idx",)  # GPT-2: attention scaled by 1/(i + 1)


def renumbering_refusal(model: PreTrainedModel) -> str | None:
    """Why removing blocks from this model cannot give a stock checkpoint with the same function."""
    for flag in INDEX_DEPENDENT_FLAGS:
        if getattr(model.config, flag, False):
            return (
                f"shortgpt cannot remove blocks from a model with config.{flag} set: its blocks compute "
                "with their own index, so the kept blocks, renumbered, would compute something else once "
                "saved and loaded again; use attention-drop or mlp-drop, which keep the layer count"
            )
    return None


def choose_removed(influence: list[float], count: int) -> list[int]:
    """The `count` blocks with the lowest BI (ties: the later block first), ascending."""
    order = sorted(range(len(influence)), key=lambda layer: (influence[layer], -layer))
    return sorted(order[:count])


def remove_blocks(model: PreTrainedModel, adapter: FamilyAdapter, removed: list[int]) -> list[int | None]:
    """Delete blocks `removed` (dense indices) in place; return dense index -> new index (None: gone)."""
    blocks = adapter.blocks(model)
    num_blocks = len(blocks)
    gone = set(removed)
    layer_map: list[int | None] = []
    kept: list[nn.Module] = []
    for index, block in enumerate(blocks):
        if index in gone:
            layer_map.append(None)
            continue
        layer_map.append(len(kept))
        _renumber(block, len(kept))
        kept.append(block)
    set_path(model, adapter.blocks_path, nn.ModuleList(kept))
    config = model.config
    config.num_hidden_layers = len(kept)  # GPT-2's n_layer follows through the config's attribute_map
    for name in PER_LAYER_CONFIG_LISTS:
        values = getattr(config, name, None)
        if isinstance(values, list | tuple) and len(values) == num_blocks:
            setattr(config, name, [value for index, value in enumerate(values) if index not in gone])
    return layer_map


def _renumber(block: nn.Module, new_index: int) -> None:
    """Set every `layer_idx` inside the block (attention modules use it to find their cache slot)."""
    for module in block.modules():
        if isinstance(getattr(module, "layer_idx", None), int):
            setattr(module, "layer_idx", new_index)  # noqa: B010 (a plain int attribute, not a submodule)
