"""End-to-end probes: the whole pruned model against the whole dense one on each prompt.

- `model_probe`: full forwards of both; logits and probabilities at every prompt position but
  the first (the attention sink's), and the final hidden state (before the final norm) when the
  two residual streams are comparable (not sliced).
- `mc_subspace_probe`: for multiple-choice prompts, the next-token distribution at the last
  position over the full vocabulary and restricted to the option tokens (renormalised); under the
  `released-code` convention also restricted to the tokens " a" .. " d", as the authors' code does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from core.probe_conventions import PRUNECAST, ProbeConvention
from workers.architectures import FamilyAdapter
from workers.evaluation.model_facts import last_logits_only
from workers.probing.common import (
    capture_final_hidden,
    family_adapters,
    model_device,
    residual_mismatch,
    token_chunks,
)
from workers.probing.deviation import kl_divergence, kl_estimate, probability_deviations, vector_deviations
from workers.probing.head import output_head
from workers.probing.prompts import ProbePrompt
from workers.probing.records import ProbeRecord, RecordSums


@torch.no_grad()
def model_probe(
    dense: nn.Module,
    pruned: nn.Module,
    input_ids: list[torch.Tensor],
    *,
    temperature: float = 1.0,
    convention: ProbeConvention = PRUNECAST,
) -> list[ProbeRecord]:
    """Records at probe "model", layer None: logits space ("1-cos" with estimate, "dpar",
    "dperp", "alpha"), probs space ("1-cos", "kl", with estimates), and the embedding space of the
    final hidden state when the residual streams are comparable. KL(dense || pruned) in every
    convention; the logits are read as the convention reads the model's output."""
    adapter, pruned_adapter = family_adapters(dense, pruned)
    comparable = residual_mismatch(adapter, dense, pruned) is None
    dense_head = output_head(adapter, dense, convention=convention)
    pruned_head = output_head(pruned_adapter, pruned, dense_head.device, convention)
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


def letter_token_ids(tokenizer: Any, letters: tuple[str, ...]) -> list[int]:
    """The token of each letter string as the authors' code takes it: the last token of its
    encoding (" a" -> one token in byte-level vocabularies). ValueError if two share a token."""
    encoded = [_encode(tokenizer, letter, special=False) for letter in letters]
    if not all(encoded) or len({ids[-1] for ids in encoded}) != len(letters):
        raise ValueError(f"option letters {letters!r} do not end in distinct tokens")
    return [ids[-1] for ids in encoded]


@torch.no_grad()
def mc_subspace_probe(
    dense: nn.Module,
    pruned: nn.Module,
    tokenizer: Any,
    prompts: list[ProbePrompt],
    *,
    temperature: float = 1.0,
    convention: ProbeConvention = PRUNECAST,
) -> list[ProbeRecord]:
    """Records at probe "mc-subspace", means over the prompts that have options: space "probs"
    (full vocabulary), space "options" (the prompt's option tokens only, renormalised) and, where
    the convention names option letters, space "option-letters" (those tokens, renormalised), each
    with "kl" (KL(dense || pruned) in every convention, with estimate) and "argmax_agree" (1 where
    both models' most likely token is the same). Prompts without options are ignored."""
    adapter, pruned_adapter = family_adapters(dense, pruned)
    dense_head = output_head(adapter, dense, convention=convention)
    pruned_head = output_head(pruned_adapter, pruned, dense_head.device, convention)
    letters = None
    if convention.option_letters is not None:
        letters = letter_token_ids(tokenizer, convention.option_letters)
    scored = []
    for prompt in prompts:
        if not prompt.options:
            continue
        ids = torch.tensor(_encode(tokenizer, prompt.text, special=True), dtype=torch.long)
        z = dense_head(final_hidden(adapter, dense, ids)[-1:])  # (1, V) float32
        z2 = pruned_head(final_hidden(pruned_adapter, pruned, ids)[-1:])
        subspaces = {"options": option_token_ids(tokenizer, prompt.options)}
        if letters is not None:
            subspaces["option-letters"] = letters
        scored.append((z, z2, subspaces))
    return mc_subspace_records(scored, temperature)


def mc_subspace_records(
    scored: Sequence[tuple[torch.Tensor, torch.Tensor, Mapping[str, list[int]]]], temperature: float = 1.0
) -> list[ProbeRecord]:
    """`mc_subspace_probe`'s records from each prompt's next-token scores (dense, pruned, each (1, V))
    and its subspaces (space name -> token ids)."""
    sums = RecordSums("mc-subspace")
    for z, z2, subspaces in scored:
        z2 = z2.to(z.device)
        restricted = [("probs", z, z2)]
        for space, token_ids in subspaces.items():
            tokens = torch.tensor(token_ids, device=z.device)
            # softmax over these = p restricted, renormalised
            restricted.append((space, z[:, tokens], z2[:, tokens]))
        for space, dense_scores, pruned_scores in restricted:
            sums.add(
                space,
                "kl",
                kl_divergence(dense_scores, pruned_scores, temperature),
                kl_estimate(dense_scores, pruned_scores, temperature),
            )
            agree = dense_scores.argmax(dim=-1) == pruned_scores.argmax(dim=-1)
            sums.add(space, "argmax_agree", agree.double())
    return sums.records()
