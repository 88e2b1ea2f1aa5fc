"""End-to-end probes: the whole pruned model against the whole dense one on each prompt.

- `model_probe`: full forwards of both; logits and probabilities at every prompt position but
  the first (the attention sink's), and the final hidden state (before the final norm) when the
  two residual streams are comparable (not sliced).
- `mc_subspace_probe`: for multiple-choice prompts, the next-token distribution at the last
  position over the full vocabulary and restricted to the option tokens (renormalised).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from workers.accuracy import last_logits_only
from workers.probing.common import (
    capture_final_hidden,
    family_adapters,
    model_device,
    residual_mismatch,
    token_chunks,
)
from workers.probing.deviation import kl_divergence, kl_estimate, probability_deviations, vector_deviations
from workers.probing.head import Float32Head
from workers.probing.prompts import ProbePrompt
from workers.probing.records import ProbeRecord, RecordSums
from workers.slicing.adapters import FamilyAdapter


@torch.no_grad()
def model_probe(
    dense: nn.Module, pruned: nn.Module, input_ids: list[torch.Tensor], *, temperature: float = 1.0
) -> list[ProbeRecord]:
    """Records at probe "model", layer None: logits space ("1-cos" with estimate, "dpar",
    "dperp"), probs space ("1-cos", "kl", with estimates), and the embedding space of the final
    hidden state when the residual streams are comparable."""
    adapter, pruned_adapter = family_adapters(dense, pruned)
    comparable = residual_mismatch(adapter, dense, pruned) is None
    dense_head = Float32Head(adapter, dense)
    pruned_head = Float32Head(pruned_adapter, pruned, dense_head.device)
    sums = RecordSums("model")
    for ids in input_ids:
        h = final_hidden(adapter, dense, ids)[1:]  # (T-1, D): the attention sink's position left out
        h2 = final_hidden(pruned_adapter, pruned, ids)[1:]
        if comparable:
            sums.add_deviations("embedding", vector_deviations(h, h2.to(h.device)))
        for rows in token_chunks(h.shape[0], dense_head.vocab):
            z, z2 = dense_head(h[rows]), pruned_head(h2[rows])  # (n, V) float32 logits
            sums.add_deviations("logits", vector_deviations(z, z2))
            sums.add_deviations("probs", probability_deviations(z, z2, temperature))
    return sums.records()


def final_hidden(adapter: FamilyAdapter, model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """(T, D): the final norm's input at every position of one prompt (the model's dtype), from a
    forward that asks the model for no more logits than it must compute."""
    with capture_final_hidden(adapter, model) as found:
        model(input_ids=ids[None].to(model_device(model)), use_cache=False, **last_logits_only(model))
    return found["final"][0]


def _encode(tokenizer: Any, text: str, *, special: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=special)["input_ids"])


def option_token_ids(tokenizer: Any, options: tuple[str, ...]) -> list[int]:
    """The token of each option: the first token of " " + option (how "Answer: B" continues).

    Where those collide (a tokenizer that splits off the space, as byte-level or SentencePiece
    ones with a separate "▁" do), the first token of the bare option instead. ValueError if the
    options still share a token.
    """
    for prefix in (" ", ""):
        encoded = [_encode(tokenizer, prefix + option, special=False) for option in options]
        if all(encoded) and len({ids[0] for ids in encoded}) == len(options):
            return [ids[0] for ids in encoded]
    raise ValueError(f"options {options!r} do not start with distinct tokens; cannot restrict to them")


@torch.no_grad()
def mc_subspace_probe(
    dense: nn.Module,
    pruned: nn.Module,
    tokenizer: Any,
    prompts: list[ProbePrompt],
    *,
    temperature: float = 1.0,
) -> list[ProbeRecord]:
    """Records at probe "mc-subspace", means over the prompts that have options: space "probs"
    (full vocabulary) and space "options" (option tokens only, renormalised), each with "kl"
    (KL(dense || pruned), with estimate) and "argmax_agree" (1 where both models' most likely
    token is the same). Prompts without options are ignored."""
    adapter, pruned_adapter = family_adapters(dense, pruned)
    dense_head = Float32Head(adapter, dense)
    pruned_head = Float32Head(pruned_adapter, pruned, dense_head.device)
    scored = []
    for prompt in prompts:
        if not prompt.options:
            continue
        ids = torch.tensor(_encode(tokenizer, prompt.text, special=True), dtype=torch.long)
        z = dense_head(final_hidden(adapter, dense, ids)[-1:])  # (1, V) float32
        z2 = pruned_head(final_hidden(pruned_adapter, pruned, ids)[-1:])
        scored.append((z, z2, option_token_ids(tokenizer, prompt.options)))
    return mc_subspace_records(scored, temperature)


def mc_subspace_records(
    scored: Sequence[tuple[torch.Tensor, torch.Tensor, list[int]]], temperature: float = 1.0
) -> list[ProbeRecord]:
    """`mc_subspace_probe`'s records from each prompt's next-token scores (dense, pruned, each (1, V))
    and its option tokens."""
    sums = RecordSums("mc-subspace")
    for z, z2, option_ids in scored:
        options = torch.tensor(option_ids, device=z.device)
        z2 = z2.to(z.device)
        for space, dense_scores, pruned_scores in (
            ("probs", z, z2),
            ("options", z[:, options], z2[:, options]),  # softmax over these = p restricted, renormalised
        ):
            sums.add(
                space,
                "kl",
                kl_divergence(dense_scores, pruned_scores, temperature),
                kl_estimate(dense_scores, pruned_scores, temperature),
            )
            agree = dense_scores.argmax(dim=-1) == pruned_scores.argmax(dim=-1)
            sums.add(space, "argmax_agree", agree.double())
    return sums.records()
