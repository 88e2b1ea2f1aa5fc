"""Generation divergence (docs/science.md §3): dense and pruned models each generate from the same
prompt on their own trajectory (own KV cache, own tokens), and each step compares the two next-
token distributions, so errors compound as the trajectories part.

Two modes: greedy (argmax; ties go to the lowest id, as in HF generate) and sampled at temperature
T with shared randomness: one uniform u per prompt and step, drawn from a generator seeded with
`seed`, and both models take the inverse-CDF token of their own distribution at u, so identical
distributions give identical tokens. Sampling is pure temperature sampling (no top-k / top-p).
Generation runs a fixed number of steps (no stop at end-of-sequence).

Per step (mean over prompts): "1-cos" with estimate in the embedding space (final hidden state
before the final norm; when the residual streams are comparable), logits and probs spaces, "kl"
with estimate, and in space "tokens" "agree" (fraction of prompts whose two tokens at this step
agree) and "prefix_agree" (fraction whose tokens agreed at every step so far). Per step and dense
layer l (comparable streams, layer kept): "1-cos" of the hidden state after dense block l and
after pruned block layer_map[l] at the new position, for a layer x step map.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from core.probe_conventions import PRUNECAST, ProbeConvention
from workers.architectures import FamilyAdapter
from workers.evaluation.model_facts import cache_argument, last_logits_only
from workers.probing.common import capture_last_positions, family_adapters, model_device, residual_mismatch
from workers.probing.counterfactual import check_layer_map
from workers.probing.deviation import probability_deviations, vector_deviations
from workers.probing.head import output_head
from workers.probing.records import ProbeRecord, ProbeStopped, ProgressCallback, RecordSums, StopCheck

MODES = ("greedy", "sampled")


def sampling_uniforms(seed: int, prompts: int, steps: int) -> torch.Tensor:
    """(prompts, steps) float64 uniforms in [0, 1), the same for both models."""
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(prompts, steps, generator=generator, dtype=torch.float64)


def choose_token(logits: torch.Tensor, uniform: float | None, temperature: float) -> int:
    """Greedy (uniform None): argmax. Sampled: the first token whose cumulative probability under
    softmax(logits / T) exceeds uniform (inverse CDF)."""
    if uniform is None:
        return int(logits.argmax())
    cumulative = torch.softmax(logits.double().cpu() / temperature, dim=-1).cumsum(dim=-1)  # (V,)
    index = torch.searchsorted(  # right=True: a zero-probability token is never picked
        cumulative, torch.tensor([uniform * float(cumulative[-1])], dtype=torch.float64), right=True
    )
    return min(int(index), logits.numel() - 1)


@dataclass
class StepState:
    """What one model shows at its newest position."""

    logits: torch.Tensor  # (V,) next-token scores
    final: torch.Tensor | None  # (D,) final hidden state before the final norm
    blocks: list[torch.Tensor | None]  # (D,) output of each block


class Runner:
    """Runs one model token by token with its KV cache, capturing hidden states at the newest position."""

    def __init__(
        self,
        model: nn.Module,
        adapter: FamilyAdapter,
        *,
        hidden: bool,
        stack: ExitStack,
        convention: ProbeConvention = PRUNECAST,
    ) -> None:
        self.model = model
        self.device = model_device(model)
        self.hidden = hidden
        self._found = stack.enter_context(capture_last_positions(adapter, model, blocks=hidden))
        self._head = output_head(adapter, model, convention=convention)
        self._cache_name = cache_argument(model)
        self._keep = last_logits_only(model)  # the logits are read from the final hidden state
        self._cache: Any = None

    def _state(self, output: Any) -> StepState:
        cache = getattr(output, "cache", None)
        self._cache = cache if cache is not None else getattr(output, "past_key_values", None)
        return StepState(
            logits=self._head(self._found["final"][None])[0],  # float32, read from the final hidden state
            final=self._found["final"] if self.hidden else None,
            blocks=list(self._found["blocks"]),
        )

    def start(self, prompt: torch.Tensor) -> StepState:
        """Run the prompt (T,); the state predicts the first new token."""
        return self._state(self.model(input_ids=prompt[None].to(self.device), use_cache=True, **self._keep))

    def feed(self, token: int) -> StepState:
        """Append one token through the cache; the state predicts the next."""
        ids = torch.tensor([[token]], device=self.device)
        return self._state(
            self.model(input_ids=ids, use_cache=True, **{self._cache_name: self._cache}, **self._keep)
        )


@torch.no_grad()
def generate_tokens(
    model: nn.Module,
    prompt: torch.Tensor,
    max_new_tokens: int,
    *,
    uniforms: torch.Tensor | None = None,
    temperature: float = 1.0,
) -> list[int]:
    """The tokens the probe's generation loop produces for one model: greedy without `uniforms`,
    else sampled with uniforms[step]."""
    with ExitStack() as stack:
        runner = Runner(model, _adapter(model), hidden=False, stack=stack)
        state = runner.start(prompt)
        tokens = []
        for step in range(max_new_tokens):
            uniform = None if uniforms is None else float(uniforms[step])
            tokens.append(choose_token(state.logits, uniform, temperature))
            if step + 1 < max_new_tokens:
                state = runner.feed(tokens[-1])
    return tokens


def _adapter(model: nn.Module) -> FamilyAdapter:
    return family_adapters(model, model)[0]


@torch.no_grad()
def generation_probe(
    dense: nn.Module,
    pruned: nn.Module,
    layer_map: list[int | None],
    input_ids: list[torch.Tensor],
    *,
    max_new_tokens: int = 32,
    temperature: float = 1.0,
    seed: int = 0,
    convention: ProbeConvention = PRUNECAST,
    progress: ProgressCallback | None = None,
    should_stop: StopCheck | None = None,
) -> list[ProbeRecord]:
    """Records at probes "generation-greedy" and "generation-sampled", per step (see the module doc);
    the logits read as the convention reads the model's output."""
    adapter, pruned_adapter = family_adapters(dense, pruned)
    check_layer_map(layer_map, len(adapter.blocks(dense)), len(pruned_adapter.blocks(pruned)))
    comparable = residual_mismatch(adapter, dense, pruned) is None
    uniforms = sampling_uniforms(seed, len(input_ids), max_new_tokens)
    total, done = len(MODES) * len(input_ids) * max_new_tokens, 0
    records: list[ProbeRecord] = []
    with ExitStack() as stack:
        dense_runner = Runner(dense, adapter, hidden=comparable, stack=stack, convention=convention)
        pruned_runner = Runner(pruned, pruned_adapter, hidden=comparable, stack=stack, convention=convention)
        for mode in MODES:
            sums = RecordSums(f"generation-{mode}")
            for index, prompt in enumerate(input_ids):
                prefix_agrees = True
                dense_state, pruned_state = dense_runner.start(prompt), pruned_runner.start(prompt)
                for step in range(max_new_tokens):
                    if should_stop is not None and should_stop():
                        raise ProbeStopped(f"stopped before {mode} step {step} of prompt {index}")
                    _measure_step(sums, step, dense_state, pruned_state, layer_map, temperature)
                    uniform = None if mode == "greedy" else float(uniforms[index, step])
                    dense_token = choose_token(dense_state.logits, uniform, temperature)
                    pruned_token = choose_token(pruned_state.logits, uniform, temperature)
                    agrees = dense_token == pruned_token
                    prefix_agrees = prefix_agrees and agrees
                    sums.add("tokens", "agree", torch.tensor([float(agrees)]), step=step)
                    sums.add("tokens", "prefix_agree", torch.tensor([float(prefix_agrees)]), step=step)
                    if step + 1 < max_new_tokens:
                        dense_state = dense_runner.feed(dense_token)
                        pruned_state = pruned_runner.feed(pruned_token)
                    done += 1
                    if progress is not None:
                        progress(done, total)
            records += sums.records()
    return records


def _measure_step(
    sums: RecordSums,
    step: int,
    dense: StepState,
    pruned: StepState,
    layer_map: list[int | None],
    temperature: float,
) -> None:
    """Add one prompt's comparison at one step (each tensor one token)."""
    z, z2 = dense.logits[None], pruned.logits[None].to(dense.logits.device)  # (1, V)
    if dense.final is not None and pruned.final is not None:
        h2 = pruned.final[None].to(dense.final.device)
        sums.add_deviations(
            "embedding", vector_deviations(dense.final[None], h2), step=step, metrics=("1-cos",)
        )
    sums.add_deviations("logits", vector_deviations(z, z2), step=step, metrics=("1-cos",))
    sums.add_deviations("probs", probability_deviations(z, z2, temperature), step=step)
    for layer, target in enumerate(layer_map):
        if target is None:
            continue
        h, h2_block = dense.blocks[layer], pruned.blocks[target]
        if h is None or h2_block is None:
            continue
        sums.add_deviations(
            "embedding",
            vector_deviations(h[None], h2_block[None].to(h.device)),
            layer=layer,
            step=step,
            metrics=("1-cos",),
        )
