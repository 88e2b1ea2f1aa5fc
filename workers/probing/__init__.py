"""Deviation probing (docs/science.md §3): where and how much a pruned model departs from its dense
original, in the embedding, logits and probability spaces.

- `counterfactual_probe`: per layer, prune only one sublayer (attention, MLP, whole block) on the
  dense input; one dense pass plus one block forward per layer and sublayer.
- `model_probe`: the whole pruned model against the whole dense one.
- `generation_probe`: greedy and sampled generation, each model on its own trajectory, per step.
- `mc_subspace_probe`: multiple-choice prompts, full vocabulary versus the option tokens.

The math lives in `workers.probing.deviation`; KL is summed over the vocabulary, in nats, and is
KL(dense || pruned) except per sublayer under the `released-code` convention, where it is
KL(pruned || dense). Every probe takes a `convention` (`core.probe_conventions`): the rules its
numbers are read by, the paper's text by default (docs/science.md §3).
"""

from workers.probing.counterfactual import (
    MEASURING_POINTS,
    SLICED_SUBLAYERS_REASON,
    SUBLAYERS,
    counterfactual_probe,
    counterfactual_unavailable,
)
from workers.probing.endpoint import mc_subspace_probe, mc_subspace_records, model_probe, option_token_ids
from workers.probing.generation import generate_tokens, generation_probe
from workers.probing.prompts import BUILTIN_PROMPTS, ProbePrompt
from workers.probing.records import ProbeRecord, ProbeStopped

__all__ = [
    "BUILTIN_PROMPTS",
    "MEASURING_POINTS",
    "SLICED_SUBLAYERS_REASON",
    "SUBLAYERS",
    "ProbePrompt",
    "ProbeRecord",
    "ProbeStopped",
    "counterfactual_probe",
    "counterfactual_unavailable",
    "generate_tokens",
    "generation_probe",
    "mc_subspace_probe",
    "mc_subspace_records",
    "model_probe",
    "option_token_ids",
]
