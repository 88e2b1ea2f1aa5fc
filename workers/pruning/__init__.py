"""Pruners besides SliceGPT: intra-layer sparsity (magnitude, Wanda, SparseGPT; unstructured, 2:4,
4:8) and layer removal (attention drop, MLP drop, ShortGPT). docs/science.md §1 describes them.

Importing this package loads torch and transformers (the HTTP side never imports it).

- `prune_model` (engine) -> `PruningReport`; `PruningStopped` when `should_stop()` asks.
- `save_pruned` / `load_pruned` (artifacts): stock transformers checkpoints of kind
  `PRUNED_ARTIFACT_KIND` ("pruned-model") plus prunecast_pruning.json.
- Building blocks: `masks` (per-row and N:M masks), `wanda.wanda_scores`,
  `sparsegpt.sparsegpt_prune`, `sequential.prune_sequentially`, `layer_drop`, `shortgpt`.
"""

from workers.pruning.artifacts import ARTIFACT_KIND, load_pruned, save_pruned
from workers.pruning.engine import ENGINES, PruningReport, prune_model
from workers.pruning.masks import PATTERNS
from workers.pruning.stream import PruningStopped

PRUNED_ARTIFACT_KIND = ARTIFACT_KIND  # = core.methods.PRUNED_ARTIFACT

__all__ = [
    "ARTIFACT_KIND",
    "ENGINES",
    "PATTERNS",
    "PRUNED_ARTIFACT_KIND",
    "PruningReport",
    "PruningStopped",
    "load_pruned",
    "prune_model",
    "save_pruned",
]
