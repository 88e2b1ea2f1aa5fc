"""Probes along the dense model's own greedy generation (docs/science.md §3).

- `decoding_counterfactual_probe`: the local counterfactual at every decoding step, as the research
  runs it, filling `step` of probe "counterfactual".
- `teacher_forced_probe`: the pruned model fed the dense model's tokens (probe
  "generation-teacher-forced"): per step the deviation of its next-token distribution from the dense
  one, with no compounding, since both read the same prefix. Set beside "generation-greedy", where each
  model continues its own text, the gap between the two is what compounding adds.

Causal attention makes a sequence's hidden states the same whether it is generated token by token
with a cache or run whole, so each prompt is continued greedily by the dense model once and the
probes run on prompt + continuation in one pass; step j reads the position that predicts the j-th
generated token (the last prompt position for j = 0). Under the `released-code` convention the
dense model samples its continuation at T instead (the generation probe's shared uniforms, seeded),
as the authors' layer-wise scripts do.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from core.probe_conventions import PRUNECAST, ProbeConvention
from workers.probing.common import family_adapters, token_chunks
from workers.probing.counterfactual import SUBLAYERS, counterfactual_probe
from workers.probing.deviation import probability_deviations, vector_deviations
from workers.probing.endpoint import final_hidden
from workers.probing.generation import generate_tokens, sampling_uniforms
from workers.probing.head import output_head
from workers.probing.records import ProbeRecord, ProbeStopped, ProgressCallback, RecordSums, StopCheck

TEACHER_FORCED = "generation-teacher-forced"


def dense_continuations(
    dense: nn.Module,
    input_ids: list[torch.Tensor],
    max_new_tokens: int,
    *,
    uniforms: torch.Tensor | None = None,
    temperature: float = 1.0,
) -> list[tuple[torch.Tensor, list[int], list[int]]]:
    """Per prompt: (prompt + the dense continuation but its last token, the generated tokens, the
    position predicting each of them). Greedy, or sampled at T with uniforms[prompt, step]."""
    out = []
    for index, ids in enumerate(input_ids):
        drawn = None if uniforms is None else uniforms[index]
        tokens = generate_tokens(dense, ids, max_new_tokens, uniforms=drawn, temperature=temperature)
        sequence = torch.cat([ids, torch.tensor(tokens[:-1], dtype=ids.dtype)])
        out.append((sequence, tokens, [len(ids) - 1 + step for step in range(max_new_tokens)]))
    return out


@torch.no_grad()
def decoding_counterfactual_probe(
    dense: nn.Module,
    pruned: nn.Module,
    layer_map: list[int | None],
    input_ids: list[torch.Tensor],
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    sublayers: Sequence[str] = SUBLAYERS,
    bases: Sequence[torch.Tensor] | None = None,
    convention: ProbeConvention = PRUNECAST,
    seed: int = 0,
    progress: ProgressCallback | None = None,
    should_stop: StopCheck | None = None,
) -> list[ProbeRecord]:
    """Records at probe "counterfactual" with `step` 0 .. max_new_tokens - 1 (module docstring); the
    dense model drives greedily, or sampling at T with `seed` where the convention says so."""
    uniforms = None
    if convention.sampled_driver:
        uniforms = sampling_uniforms(seed, len(input_ids), max_new_tokens)
    continued = dense_continuations(
        dense, input_ids, max_new_tokens, uniforms=uniforms, temperature=temperature
    )
    return counterfactual_probe(
        dense,
        pruned,
        layer_map,
        [sequence for sequence, _, _ in continued],
        temperature=temperature,
        sublayers=sublayers,
        bases=bases,
        step_positions=[positions for _, _, positions in continued],
        convention=convention,
        progress=progress,
        should_stop=should_stop,
    )


@torch.no_grad()
def teacher_forced_probe(
    dense: nn.Module,
    pruned: nn.Module,
    input_ids: list[torch.Tensor],
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    convention: ProbeConvention = PRUNECAST,
    should_stop: StopCheck | None = None,
) -> list[ProbeRecord]:
    """Records at probe "generation-teacher-forced", per step: logits "1-cos" (with estimate),
    probs "1-cos" and "kl" (with estimates), and tokens "agree" (the pruned model's argmax is the
    dense model's token). The dense text is greedy in every convention: the gap to
    "generation-greedy" is what compounding adds."""
    adapter, pruned_adapter = family_adapters(dense, pruned)
    dense_head = output_head(adapter, dense, convention=convention)
    pruned_head = output_head(pruned_adapter, pruned, dense_head.device, convention)
    sums = RecordSums(TEACHER_FORCED)
    for index, (sequence, tokens, positions) in enumerate(
        dense_continuations(dense, input_ids, max_new_tokens)
    ):
        if should_stop is not None and should_stop():
            raise ProbeStopped(f"stopped before teacher-forced prompt {index}")
        h = final_hidden(adapter, dense, sequence)[positions]  # (S, D)
        h2 = final_hidden(pruned_adapter, pruned, sequence)[positions]
        for rows in token_chunks(h.shape[0], dense_head.vocab):
            z, z2 = dense_head(h[rows]), pruned_head(h2[rows])  # (n, V)
            agree = (z2.argmax(dim=-1).cpu() == torch.tensor(tokens[rows])).double()  # (n,)
            for offset in range(z.shape[0]):  # one step per row
                one, step = slice(offset, offset + 1), rows.start + offset
                logits = [d for d in vector_deviations(z[one], z2[one]) if d.metric == "1-cos"]
                sums.add_deviations("logits", logits, step=step)
                sums.add_deviations("probs", probability_deviations(z[one], z2[one], temperature), step=step)
                sums.add("tokens", "agree", agree[one], step=step)
    return sums.records()
