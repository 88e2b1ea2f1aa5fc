"""Log-likelihoods of continuations, as lm-evaluation-harness scores its `loglikelihood` requests:
the scorer that multiple choice and LAMBADA share, and what every task's scoring records.

Tokenisation follows lm-eval's HF model: trailing whitespace of the context moves to the
continuation, `context + continuation` is encoded whole (no special tokens) and split after the
tokens of the context alone, an empty context is replaced by one prefix token (BOS, else EOS),
and over-long inputs are cut on the left to the model's context length.

Speed: the requests of every option of every doc are scored together, never one token at a time,
on the model's device (CPU or CUDA). Options that share their context tokens (every option of an
ordinary doc) run the context once, right-padded across docs, and then all their continuations
in one pass on its KV cache (`share_context`, on by default; off for sliding-window attention).
Other requests are sorted by length, longest first, and scored in right-padded batches with an
attention mask. Only positions that predict continuation tokens become logits (`logits_to_keep`
where the model supports it). `batch_size=1, share_context=False` is lm-eval's one-by-one path.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from workers.evaluation.model_facts import cache_argument, context_length, wants_bos
from workers.evaluation.perplexity import EvaluationStopped

DEFAULT_BATCH_SIZE = 16  # options per forward pass


@dataclass(frozen=True)
class EncodedRequest:
    """Token ids of one (context, continuation) pair; the continuation tokens are scored."""

    context: tuple[int, ...]
    continuation: tuple[int, ...]


def encode_request(
    tokenizer: Any, context: str, continuation: str, *, prefix_ids: Sequence[int] = ()
) -> EncodedRequest:
    """lm-eval's `_encode_pair` for one request; `prefix_ids` (BOS) go before the context."""
    return _encode_all(tokenizer, [(context, continuation)], prefix_ids=prefix_ids, empty_prefix=None)[0]


def _encode_all(
    tokenizer: Any,
    requests: Sequence[tuple[str, str]],
    *,
    prefix_ids: Sequence[int],
    empty_prefix: int | None,
) -> list[EncodedRequest]:
    contexts, wholes, empty = [], [], []
    for context, continuation in requests:
        empty.append(context == "")
        spaces = len(context) - len(context.rstrip())
        if spaces:  # "Answer: " + "x" -> "Answer:" + " x", as a tokenizer would split it
            continuation = context[-spaces:] + continuation
            context = context[:-spaces]
        contexts.append(context)
        wholes.append(context + continuation)
    context_ids = tokenizer(contexts, add_special_tokens=False)["input_ids"]
    whole_ids = tokenizer(wholes, add_special_tokens=False)["input_ids"]
    encoded = []
    for no_context, context_enc, whole_enc, (_, continuation) in zip(
        empty, context_ids, whole_ids, requests, strict=True
    ):
        if no_context and empty_prefix is not None:
            # lm-eval: no context -> one prefix token, continuation encoded on its own
            cont = tokenizer(continuation, add_special_tokens=False)["input_ids"]
            head = tuple(prefix_ids) if prefix_ids else (empty_prefix,)
            encoded.append(EncodedRequest(head, tuple(cont)))
            continue
        encoded.append(
            EncodedRequest(tuple(prefix_ids) + tuple(context_enc), tuple(whole_enc[len(context_enc) :]))
        )
    return encoded


def loglikelihoods(
    model: torch.nn.Module,
    tokenizer: Any,
    requests: Sequence[tuple[str, str]],
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    share_context: bool = True,
    add_bos: bool | None = None,
    progress: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> list[float]:
    """Summed log-likelihood of each continuation given its context, in request order.

    `batch_size=1, share_context=False` scores one request per forward pass with no padding and
    no cache: the reference the batched paths must equal. `add_bos=None` follows lm-eval: BOS
    only for Gemma models.
    """
    encoded = encode_requests(model, tokenizer, requests, add_bos=add_bos)
    return score_encoded(
        model,
        encoded,
        batch_size=batch_size,
        share_context=share_context,
        progress=progress,
        should_stop=should_stop,
    ).loglikelihoods


def encode_requests(
    model: torch.nn.Module, tokenizer: Any, requests: Sequence[tuple[str, str]], *, add_bos: bool | None
) -> list[EncodedRequest]:
    """Encode (context, continuation) pairs as lm-eval does, with BOS first when asked for."""
    bos = wants_bos(model) if add_bos is None else add_bos
    bos_id = getattr(tokenizer, "bos_token_id", None)
    eos_id = getattr(tokenizer, "eos_token_id", None)
    if bos and bos_id is None:
        raise ValueError("add_bos was asked for but the tokenizer has no BOS token")
    empty_prefix = bos_id if bos_id is not None else eos_id
    prefix_ids: tuple[int, ...] = (bos_id,) if bos and bos_id is not None else ()
    return _encode_all(tokenizer, requests, prefix_ids=prefix_ids, empty_prefix=empty_prefix)


@dataclass(frozen=True)
class ScoredRequests:
    """Scores of encoded requests, in request order, with what it took to compute them."""

    loglikelihoods: list[float]
    greedy: list[bool]  # whether greedy decoding from the context gives exactly the continuation
    truncated: int  # requests whose context was cut on the left to fit the context length
    forward_passes: int
    shared_contexts: int = 0  # contexts run once for several continuations


def score_encoded(
    model: torch.nn.Module,
    encoded: Sequence[EncodedRequest],
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    share_context: bool = True,
    progress: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> ScoredRequests:
    """Summed continuation log-likelihoods of already encoded requests (see module docstring).

    With `share_context`, requests whose context tokens are identical (the options of one doc)
    run their context once and their continuations on its KV cache; `batch_size` then counts
    the continuations of a batch. Requests that would need truncation, contexts with a single
    request and models with sliding-window attention take the plain path: one padded row per
    request.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    _check_requests(encoded)
    max_length = context_length(model)
    plan = _plan_batches(model, encoded, batch_size, share_context, max_length)
    results = [0.0] * len(encoded)
    greedy = [False] * len(encoded)
    device = next(model.parameters()).device
    keep_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
    done = forward_passes = 0
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for kind, work in plan.batches:
                if should_stop is not None and should_stop():
                    raise EvaluationStopped(f"stopped after {done} of {len(encoded)} requests")
                rows, scores, hits, passes = _score_work(
                    model, encoded, kind, work, device, keep_logits, max_length
                )
                forward_passes += passes
                for row, score, hit in zip(rows, scores, hits, strict=True):
                    results[row] = score
                    greedy[row] = hit
                done += len(rows)
                if progress is not None:
                    progress(done, len(encoded))
    finally:
        model.train(was_training)
    return ScoredRequests(
        loglikelihoods=results,
        greedy=greedy,
        truncated=plan.truncated,
        forward_passes=forward_passes,
        shared_contexts=plan.shared_contexts,
    )


def _check_requests(encoded: Sequence[EncodedRequest]) -> None:
    for request in encoded:
        if not request.continuation:
            raise ValueError("a continuation encoded to no tokens; every option needs at least one")
        if len(request.context) + len(request.continuation) < 2:
            raise ValueError("a request needs at least one token before its continuation (an empty prefix)")


@dataclass(frozen=True)
class _Plan:
    """The work of one scoring run: batches of ("shared", [group, ...]) or ("plain", [requests])."""

    batches: list[tuple[str, list[list[int]]]]
    truncated: int  # plain requests cut on the left to fit the context
    shared_contexts: int


def _plan_batches(
    model: torch.nn.Module,
    encoded: Sequence[EncodedRequest],
    batch_size: int,
    share_context: bool,
    max_length: int | None,
) -> _Plan:
    """Group requests that share a context (when the model allows and they fit), longest first, and
    batch the rest as plain rows, longest first (so padding stays small)."""

    def fits(index: int) -> bool:
        total = len(encoded[index].context) + len(encoded[index].continuation)
        return max_length is None or total <= max_length + 1

    groups: dict[tuple[int, ...], list[int]] = {}
    if share_context and context_sharing_supported(model):
        for index, request in enumerate(encoded):
            groups.setdefault(request.context, []).append(index)
    shared = [members for members in groups.values() if len(members) > 1 and all(map(fits, members))]
    in_shared = {index for members in shared for index in members}
    plain = [index for index in range(len(encoded)) if index not in in_shared]

    batches: list[tuple[str, list[list[int]]]] = []
    shared.sort(key=lambda members: (-_group_length(encoded, members), encoded[members[0]].context))
    current: list[list[int]] = []
    for members in shared:
        if current and sum(map(len, current)) + len(members) > batch_size:
            batches.append(("shared", current))
            current = []
        current.append(members)
    if current:
        batches.append(("shared", current))
    plain.sort(
        key=lambda i: (-_request_length(encoded[i], max_length), encoded[i].context, encoded[i].continuation)
    )
    batches.extend(
        ("plain", [plain[start : start + batch_size]]) for start in range(0, len(plain), batch_size)
    )
    truncated = sum(1 for index in plain if not fits(index))
    return _Plan(batches=batches, truncated=truncated, shared_contexts=len(shared))


def _score_work(
    model: torch.nn.Module,
    encoded: Sequence[EncodedRequest],
    kind: str,
    work: list[list[int]],
    device: torch.device,
    keep_logits: bool,
    max_length: int | None,
) -> tuple[list[int], list[float], list[bool], int]:
    """Score one batch: (the requests it held, their log-likelihoods, whether each is the greedy
    continuation, forward passes it took)."""
    if kind == "shared":
        rows = [index for group in work for index in group]
        scores, hits, passes = _score_shared_batch(
            model,
            [list(encoded[group[0]].context) for group in work],
            [[list(encoded[index].continuation) for index in group] for group in work],
            device,
            keep_logits,
        )
        return rows, scores, hits, passes
    rows = work[0]
    pairs = [_truncated(encoded[index], max_length) for index in rows]
    scores, hits = _score_batch(
        model, [inp for inp, _ in pairs], [tgt for _, tgt in pairs], device, keep_logits
    )
    return rows, scores, hits, 1


def context_sharing_supported(model: torch.nn.Module) -> bool:
    """Sharing a context's KV cache needs full attention: sliding windows would crop it."""
    config = getattr(model, "config", None)
    if getattr(config, "sliding_window", None) is not None:
        return False
    return "sliding_attention" not in (getattr(config, "layer_types", None) or ())


def _request_length(request: EncodedRequest, max_length: int | None) -> int:
    total = len(request.context) + len(request.continuation) - 1
    return total if max_length is None else min(total, max_length)


def _group_length(encoded: Sequence[EncodedRequest], members: list[int]) -> int:
    return len(encoded[members[0]].context) + max(len(encoded[index].continuation) for index in members)


def _truncated(request: EncodedRequest, max_length: int | None) -> tuple[list[int], list[int]]:
    """(model input, scored targets): (context + continuation)[:-1] cut on the left as lm-eval does."""
    whole = list(request.context) + list(request.continuation)
    if max_length is not None and len(whole) > max_length + 1:
        whole = whole[-(max_length + 1) :]
    scored = min(len(request.continuation), len(whole) - 1)
    return whole[:-1], whole[-scored:]


def _score_shared_batch(
    model: torch.nn.Module,
    contexts: Sequence[list[int]],
    continuations: Sequence[Sequence[list[int]]],
    device: torch.device,
    keep_logits: bool,
) -> tuple[list[float], list[bool], int]:
    """Contexts once (right-padded, cached), then every continuation on its context's cache.

    The last context position predicts each continuation's first token; the continuation's own
    tokens but the last, at positions len(context) + j, predict the rest. Returns the scores,
    whether each continuation is the greedy one (every token the argmax) and the number of
    forward passes (1 when every option is a single token).
    """
    context_ids, context_mask = _right_pad(contexts)  # (G, Tc), (G, Tc)
    context_lengths = torch.tensor([len(tokens) for tokens in contexts])  # (G,)
    width = context_ids.size(1)
    keep = width - int(context_lengths.min()) + 1  # covers every row's last real position
    kwargs: dict[str, Any] = {"logits_to_keep": keep} if keep_logits else {}
    out = model(
        input_ids=context_ids.to(device), attention_mask=context_mask.to(device), use_cache=True, **kwargs
    )
    last = out.logits[:, -keep:, :][
        torch.arange(len(contexts)), context_lengths - 1 - (width - keep)
    ]  # (G, V)
    first_log_probs = torch.log_softmax(last.float(), dim=-1).double().cpu()  # (G, V)

    owner = [group for group, options in enumerate(continuations) for _ in options]  # row -> group
    rows = [tokens for options in continuations for tokens in options]
    scores = [float(first_log_probs[group, tokens[0]]) for group, tokens in zip(owner, rows, strict=True)]
    first_argmax = first_log_probs.argmax(dim=-1)  # (G,)
    hits = [int(first_argmax[group]) == tokens[0] for group, tokens in zip(owner, rows, strict=True)]
    rest_width = max(len(tokens) - 1 for tokens in rows)
    if rest_width == 0:  # one-token options (BoolQ's " yes"/" no"): the context pass was enough
        return scores, hits, 1

    cache = out.cache if hasattr(out, "cache") else out.past_key_values
    owner_index = torch.tensor(owner, dtype=torch.long)
    cache.reorder_cache(owner_index.to(device))  # one cache row per continuation
    rest_ids, rest_mask = _right_pad([tokens[:-1] for tokens in rows], width=rest_width)  # (R, Tn)
    mask = torch.cat([context_mask[owner_index], rest_mask], dim=1)  # (R, Tc + Tn)
    positions = context_lengths[owner_index].unsqueeze(1) + torch.arange(rest_width)  # (R, Tn)
    logits = model(
        input_ids=rest_ids.to(device),
        attention_mask=mask.to(device),
        position_ids=positions.to(device),
        use_cache=True,
        **{cache_argument(model): cache},
    ).logits.float()  # (R, Tn, V)
    picks = torch.zeros((len(rows), rest_width), dtype=torch.long)  # (R, Tn): token predicted at j
    scored = torch.zeros((len(rows), rest_width), dtype=torch.bool)  # (R, Tn)
    for row, tokens in enumerate(rows):
        picks[row, : len(tokens) - 1] = torch.tensor(tokens[1:], dtype=torch.long)
        scored[row, : len(tokens) - 1] = True
    picked = logits.gather(-1, picks.to(device).unsqueeze(-1)).squeeze(-1)  # (R, Tn)
    token_lp = (picked - torch.logsumexp(logits, dim=-1)).double().cpu().masked_fill(~scored, 0.0)
    rest_hits = ((logits.argmax(dim=-1).cpu() == picks) | ~scored).all(dim=1)  # (R,)
    return (
        [score + float(rest) for score, rest in zip(scores, token_lp.sum(dim=1), strict=True)],
        [hit and bool(rest) for hit, rest in zip(hits, rest_hits, strict=True)],
        2,
    )


def _right_pad(rows: Sequence[list[int]], width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask), each (B, width); pad id 0 is never attended."""
    width = max(len(row) for row in rows) if width is None else width
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for index, row in enumerate(rows):
        if row:
            ids[index, : len(row)] = torch.tensor(row, dtype=torch.long)
            mask[index, : len(row)] = 1
    return ids, mask


def _score_batch(
    model: torch.nn.Module,
    inputs: Sequence[list[int]],
    targets: Sequence[list[int]],
    device: torch.device,
    keep_logits: bool,
) -> tuple[list[float], list[bool]]:
    """One forward pass over right-padded rows: the summed log-prob of each row's targets, and
    whether each target is the greedy continuation (every target token the argmax)."""
    lengths = [len(row) for row in inputs]
    ids, mask = _right_pad(inputs)  # (B, T), (B, T)
    width = ids.size(1)
    # Row r's targets are predicted at positions [L_r - n_r, L_r); only the last `keep` positions
    # of the padded batch are needed to cover every row.
    first_needed = min(length - len(target) for length, target in zip(lengths, targets, strict=True))
    keep = width - first_needed
    kwargs: dict[str, Any] = {"logits_to_keep": keep} if keep_logits else {}
    logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False, **kwargs).logits
    logits = logits[:, -keep:, :]  # (B, keep, V)
    offset = width - keep  # padded position of logits[:, 0]

    picks = torch.zeros((len(inputs), keep), dtype=torch.long)  # (B, keep) target token per position
    scored = torch.zeros((len(inputs), keep), dtype=torch.bool)  # (B, keep) positions to sum
    for row, (length, target) in enumerate(zip(lengths, targets, strict=True)):
        begin = length - len(target) - offset
        picks[row, begin : begin + len(target)] = torch.tensor(target, dtype=torch.long)
        scored[row, begin : begin + len(target)] = True
    logits = logits.float()
    picked = logits.gather(-1, picks.to(device).unsqueeze(-1)).squeeze(-1)  # (B, keep)
    token_lp = picked - torch.logsumexp(logits, dim=-1)  # (B, keep): log-softmax at the targets
    token_lp = token_lp.double().cpu().masked_fill(~scored, 0.0)
    hits = ((logits.argmax(dim=-1).cpu() == picks) | ~scored).all(dim=1)  # (B,)
    return [float(value) for value in token_lp.sum(dim=1)], [bool(hit) for hit in hits]
