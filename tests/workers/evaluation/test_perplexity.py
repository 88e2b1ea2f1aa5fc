"""Perplexity follows the SliceGPT/Wanda protocol exactly, checked against a hand-written loop."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, PreTrainedModel

from workers.evaluation.perplexity import EvaluationStopped, effective_seqlen, perplexity

SEQLEN = 32


@pytest.fixture(scope="module")
def model(tiny_llama_dir: Path) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(tiny_llama_dir, local_files_only=True).eval()


@pytest.fixture(scope="module")
def token_ids() -> torch.Tensor:
    """Five full windows of SEQLEN plus a remainder of 7 tokens, drawn from the byte vocabulary."""
    generator = torch.Generator().manual_seed(1234)
    return torch.randint(0, 256, (5 * SEQLEN + 7,), generator=generator)  # (N,)


def hand_mean_nll(model: PreTrainedModel, ids: torch.Tensor, seqlen: int) -> float:
    """Independent reference: one window at a time, log_softmax and gather the next token."""
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, ids.numel() - seqlen + 1, seqlen):
            window = ids[start : start + seqlen]  # (T,)
            logits = model(window.unsqueeze(0)).logits[0]  # (T, V)
            log_probs = torch.log_softmax(logits, dim=-1)  # (T, V)
            picked = log_probs[:-1].gather(1, window[1:].unsqueeze(1))  # (T-1, 1)
            total -= picked.double().sum().item()
            count += seqlen - 1
    return total / count


def test_perplexity_equals_exp_of_mean_token_nll(model: PreTrainedModel, token_ids: torch.Tensor) -> None:
    result = perplexity(model, token_ids, seqlen=SEQLEN)
    expected_nll = hand_mean_nll(model, token_ids, SEQLEN)
    assert result.nll_mean == pytest.approx(expected_nll, rel=1e-6)
    assert result.ppl == pytest.approx(math.exp(expected_nll), rel=1e-6)
    assert result.ppl == pytest.approx(math.exp(result.nll_mean), rel=1e-12)


def test_batched_perplexity_matches_one_window_at_a_time(
    model: PreTrainedModel, token_ids: torch.Tensor
) -> None:
    single = perplexity(model, token_ids, seqlen=SEQLEN, batch_size=1)
    batched = perplexity(model, token_ids, seqlen=SEQLEN, batch_size=4)
    assert batched.windows == single.windows == 5
    assert batched.ppl == pytest.approx(single.ppl, rel=1e-6)


def test_perplexity_scores_full_windows_and_drops_the_remainder(
    model: PreTrainedModel, token_ids: torch.Tensor
) -> None:
    result = perplexity(model, token_ids, seqlen=SEQLEN)
    assert result.windows == 5
    assert result.tokens_scored == 5 * (SEQLEN - 1)
    assert result.seqlen == SEQLEN
    assert result.max_windows is None
    altered_tail = token_ids.clone()
    altered_tail[5 * SEQLEN :] = (altered_tail[5 * SEQLEN :] + 1) % 256
    assert perplexity(model, altered_tail, seqlen=SEQLEN).ppl == result.ppl
    assert perplexity(model, token_ids[: 5 * SEQLEN], seqlen=SEQLEN).ppl == result.ppl


def test_max_windows_scores_only_the_first_windows(model: PreTrainedModel, token_ids: torch.Tensor) -> None:
    capped = perplexity(model, token_ids, seqlen=SEQLEN, max_windows=2)
    assert capped.windows == 2
    assert capped.max_windows == 2
    assert capped.tokens_scored == 2 * (SEQLEN - 1)
    assert capped.nll_mean == pytest.approx(hand_mean_nll(model, token_ids[: 2 * SEQLEN], SEQLEN), rel=1e-6)
    assert perplexity(model, token_ids, seqlen=SEQLEN, max_windows=99).windows == 5


def test_effective_seqlen_is_capped_at_the_context_length(model: PreTrainedModel) -> None:
    assert model.config.max_position_embeddings == 256
    assert effective_seqlen(model, 2048) == 256
    assert effective_seqlen(model, 128) == 128


def test_effective_seqlen_reads_n_positions_of_gpt2_style_configs() -> None:
    module = torch.nn.Linear(1, 1)
    module.config = GPT2Config(n_positions=64)  # type: ignore[assignment]
    assert effective_seqlen(module, 2048) == 64


def test_effective_seqlen_without_config_keeps_the_request() -> None:
    assert effective_seqlen(torch.nn.Linear(1, 1), 2048) == 2048


def test_too_few_tokens_for_one_window_is_a_clear_error(model: PreTrainedModel) -> None:
    with pytest.raises(ValueError, match=r"at least one window of 32 tokens, got 31"):
        perplexity(model, torch.zeros(31, dtype=torch.long), seqlen=SEQLEN)


def test_non_1d_token_ids_are_rejected(model: PreTrainedModel) -> None:
    with pytest.raises(ValueError, match="1-D"):
        perplexity(model, torch.zeros(2, 64, dtype=torch.long), seqlen=SEQLEN)


def test_should_stop_ends_the_evaluation_between_batches(
    model: PreTrainedModel, token_ids: torch.Tensor
) -> None:
    calls: list[tuple[int, int]] = []
    checks = iter([False, False, True])
    with pytest.raises(EvaluationStopped, match="after 2 of 5 windows"):
        perplexity(
            model,
            token_ids,
            seqlen=SEQLEN,
            progress=lambda done, total: calls.append((done, total)),
            should_stop=lambda: next(checks),
        )
    assert calls == [(1, 5), (2, 5)]


def test_progress_reports_windows_done_after_each_batch(
    model: PreTrainedModel, token_ids: torch.Tensor
) -> None:
    calls: list[tuple[int, int]] = []
    perplexity(
        model,
        token_ids,
        seqlen=SEQLEN,
        batch_size=2,
        progress=lambda done, total: calls.append((done, total)),
    )
    assert calls == [(2, 5), (4, 5), (5, 5)]


def test_perplexity_evaluates_in_eval_mode_and_restores_the_training_flag(
    model: PreTrainedModel, token_ids: torch.Tensor
) -> None:
    expected = perplexity(model, token_ids, seqlen=SEQLEN, max_windows=1).ppl
    model.train()
    try:
        assert perplexity(model, token_ids, seqlen=SEQLEN, max_windows=1).ppl == expected
        assert model.training
    finally:
        model.eval()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_perplexity_on_cuda_matches_cpu(model: PreTrainedModel, token_ids: torch.Tensor) -> None:
    cpu = perplexity(model, token_ids, seqlen=SEQLEN)
    torch.nn.Module.to(model, "cuda")
    try:
        cuda = perplexity(model, token_ids, seqlen=SEQLEN, batch_size=4)
    finally:
        torch.nn.Module.to(model, "cpu")
    assert cuda.ppl == pytest.approx(cpu.ppl, rel=1e-4)
