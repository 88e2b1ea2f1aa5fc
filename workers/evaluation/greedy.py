"""Batched greedy decoding with a KV cache, stop sequences and a token limit (lm-eval's
`generate_until` with `do_sample: false`).

Prompts are sorted longest first and left-padded into batches, so every row's newest token sits in
the last column; positions count real tokens only, so padding changes nothing a row computes
(a test checks batched = one by one). Each step feeds only the new tokens through the cache; a row
is done at end-of-sequence, once its decoded text holds a stop sequence, or at the token limit, and
done rows leave the batch (their cache rows are dropped). The returned text is cut before the
first stop sequence, as lm-eval cuts it. `use_cache=False` recomputes the whole sequence at every
step: the reference the cached path must equal token for token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from workers.evaluation.model_facts import cache_argument, last_logits_only
from workers.evaluation.perplexity import EvaluationStopped

STOPPED_BY = ("stop-sequence", "end-of-sequence", "token-limit")


@dataclass(frozen=True)
class Generation:
    """What greedy decoding produced for one prompt."""

    tokens: tuple[int, ...]  # every generated token, the stopping one included
    text: str  # the decoded tokens, cut before the first stop sequence
    stopped_by: str  # one of STOPPED_BY


def cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """(text before the earliest stop sequence, whether one occurred)."""
    positions = [text.find(sequence) for sequence in stop if sequence and sequence in text]
    if not positions:
        return text, False
    return text[: min(positions)], True


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask), each (B, T) with the padding on the left."""
    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for index, row in enumerate(rows):
        ids[index, width - len(row) :] = torch.tensor(list(row), dtype=torch.long)
        mask[index, width - len(row) :] = 1
    return ids, mask


@torch.inference_mode()
def greedy_generate(
    model: torch.nn.Module,
    tokenizer: Any,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    stop: Sequence[str] = (),
    eos_ids: Sequence[int] = (),
    batch_size: int = 8,
    use_cache: bool = True,
    progress: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> list[Generation]:
    """Greedy continuations of token-id `prompts`, in prompt order (see the module docstring).

    `progress(done, total)` counts finished prompts; `should_stop()` is polled before every step
    and ends the run with EvaluationStopped.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if any(len(prompt) == 0 for prompt in prompts):
        raise ValueError("every prompt needs at least one token")
    order = sorted(range(len(prompts)), key=lambda index: -len(prompts[index]))
    results: list[Generation | None] = [None] * len(prompts)
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            generated = _generate_batch(
                model,
                tokenizer,
                [prompts[index] for index in batch],
                max_new_tokens=max_new_tokens,
                stop=stop,
                eos_ids=set(eos_ids),
                use_cache=use_cache,
                should_stop=should_stop,
            )
            for index, generation in zip(batch, generated, strict=True):
                results[index] = generation
            if progress is not None:
                progress(start + len(batch), len(prompts))
    finally:
        model.train(was_training)
    return [generation for generation in results if generation is not None]


def _generate_batch(
    model: torch.nn.Module,
    tokenizer: Any,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    stop: Sequence[str],
    eos_ids: set[int],
    use_cache: bool,
    should_stop: Callable[[], bool] | None,
) -> list[Generation]:
    device = next(model.parameters()).device
    pad_id = next(iter(eos_ids), 0)
    ids, mask = left_pad(prompts, pad_id)  # (B, T), (B, T)
    ids, mask = ids.to(device), mask.to(device)
    keep = last_logits_only(model)
    cache_name = cache_argument(model)
    tokens: list[list[int]] = [[] for _ in prompts]
    finished: dict[int, Generation] = {}
    live = list(range(len(prompts)))  # prompt rows still generating, in batch-row order
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)  # (B, T): real tokens counted from 0
    output = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=use_cache, **keep)
    for step in range(max_new_tokens):
        next_tokens = output.logits[:, -1, :].argmax(dim=-1).tolist()  # (B_live,)
        keep_rows = []
        for batch_row, (row, token) in enumerate(zip(live, next_tokens, strict=True)):
            tokens[row].append(int(token))
            text, stopped = cut_at_stop(tokenizer.decode(tokens[row], skip_special_tokens=False), stop)
            reason = (
                "end-of-sequence"
                if token in eos_ids
                else "stop-sequence"
                if stopped
                else "token-limit"
                if step + 1 == max_new_tokens
                else None
            )
            if reason is None:
                keep_rows.append(batch_row)
                continue
            if reason == "end-of-sequence":
                text, _ = cut_at_stop(tokenizer.decode(tokens[row][:-1], skip_special_tokens=False), stop)
            finished[row] = Generation(tuple(tokens[row]), text, reason)
        if not keep_rows:
            break
        if should_stop is not None and should_stop():
            raise EvaluationStopped(f"stopped at generation step {step + 1} of {max_new_tokens}")
        chosen = torch.tensor(keep_rows, device=device)
        new = torch.tensor([[next_tokens[batch_row]] for batch_row in keep_rows], device=device)  # (B', 1)
        mask = torch.cat([mask[chosen], torch.ones_like(new)], dim=1)  # (B', T + step + 1)
        live = [live[batch_row] for batch_row in keep_rows]
        if use_cache:
            cache = getattr(output, "cache", None)
            cache = output.past_key_values if cache is None else cache
            if len(keep_rows) < len(next_tokens):
                cache.reorder_cache(chosen)  # done rows leave the batch
            step_positions = positions[chosen, -1:] + 1  # (B', 1)
            positions = torch.cat([positions[chosen], step_positions], dim=1)
            output = model(
                input_ids=new,
                attention_mask=mask,
                position_ids=step_positions,
                use_cache=True,
                **{cache_name: cache},
                **keep,
            )
        else:
            ids = torch.cat([ids[chosen], new], dim=1)  # (B', T + step + 1)
            positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
            output = model(
                input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False, **keep
            )
    return [finished[row] for row in range(len(prompts))]
