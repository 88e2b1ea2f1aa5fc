"""Steps 5-6 of SliceGPT end to end: interleaved PCA rotation and slicing, block by block."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from core.param_count import predict_dense_param_count, predict_sliced_param_count
from tests.workers.slicing.tiny import (
    ALL_CASES,
    FAMILY_CASES,
    HIDDEN,
    build,
    logits,
    relative_error,
    token_ids,
)
from workers.architectures import detect_family
from workers.slicing import block_slicing, engine
from workers.slicing.engine import SlicingStopped, count_parameters, slice_model
from workers.slicing.portable.sliced_modules import (
    BRANCHES,
    ParallelSkipConnectedBlock,
    SkipConnectedBlock,
    WrappedBlock,
)
from workers.slicing.portable.sliced_weights import set_weight_out_in, weight_out_in

TOLERANCE = 1e-4  # relative Frobenius error of the logits


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_slicing_at_zero_sparsity_preserves_logits(case: str) -> None:
    model = build(case)
    calibration = token_ids(4, 16, seed=1)
    ids = token_ids(3, 12, seed=2)
    expected = logits(model, ids)

    report = slice_model(model, calibration, None, 0.0, batch_size=2)

    assert report.width == HIDDEN
    assert all(isinstance(block, WrappedBlock) for block in detect_family(model).blocks(model))
    error = relative_error(logits(model, ids), expected)
    assert error < TOLERANCE, f"{case}: relative logit error {error:.2e}"


@pytest.mark.parametrize("case", ALL_CASES)
def test_slicing_at_quarter_sparsity_changes_parameters_exactly_as_predicted(case: str) -> None:
    model = build(case)
    config = model.config.to_dict()
    assert count_parameters(model) == predict_dense_param_count(config)

    report = slice_model(model, token_ids(4, 16, seed=1), None, 0.25, batch_size=4)

    assert report.width == 48  # floor(0.75 * 64), already a multiple of 8
    assert report.params_after == count_parameters(model)
    assert report.params_after == predict_sliced_param_count(config, 48) == report.predicted_params_after
    assert report.params_before == predict_dense_param_count(config) == report.predicted_params_before
    assert adapter_widths(model) == {48}
    out = logits(model, token_ids(2, 10, seed=2))
    assert out.shape == (2, 10, 128)
    assert torch.isfinite(out).all()


def adapter_widths(model: torch.nn.Module) -> set[int]:
    """Widths of the embeddings' output: the sliced residual width."""
    return {int(embedding.weight.shape[1]) for embedding in detect_family(model).embeddings(model)}


@pytest.mark.parametrize("case", ["llama", "opt"])
def test_slicing_the_head_too_matches_the_formula(case: str) -> None:
    model = build(case)
    config = model.config.to_dict()

    report = slice_model(model, token_ids(4, 16, seed=1), None, 0.25, slice_head=True)

    adapter = detect_family(model)
    assert adapter.lm_head(model).in_features == 48
    assert report.widths.blocks[-1].out == 48
    assert count_parameters(model) == predict_sliced_param_count(config, 48, slice_head=True)
    assert torch.isfinite(logits(model, token_ids(2, 10))).all()


def test_gpt2_refuses_an_unsliced_head() -> None:
    model = build("gpt2")
    with pytest.raises(ValueError, match="sliced LM head"):
        slice_model(model, token_ids(2, 8), None, 0.25, slice_head=False)


def test_sliced_model_generates_with_a_cache_like_without() -> None:
    model = build("llama")
    slice_model(model, token_ids(4, 16, seed=1), None, 0.25)
    prompt = token_ids(1, 5, seed=4)

    generated = model.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=0)

    greedy_without_cache = logits(model, generated)[0, 4:-1].argmax(-1)
    assert torch.equal(greedy_without_cache, generated[0, 5:])


@pytest.mark.parametrize("case", ["llama", "opt"])
def test_padded_calibration_positions_do_not_affect_slicing(case: str) -> None:
    calibration = token_ids(4, 16, seed=1)
    ids = token_ids(2, 12, seed=2)
    plain = build(case)
    slice_model(plain, calibration, None, 0.25, batch_size=4)

    # The same sequences right-padded with random tokens, plus one fully padded sequence.
    padded_ids = torch.cat([calibration, token_ids(4, 6, seed=5)], dim=1)
    padded_ids = torch.cat([padded_ids, token_ids(1, 22, seed=6)], dim=0)
    mask = torch.zeros_like(padded_ids)
    mask[:4, :16] = 1
    padded = build(case)
    report = slice_model(padded, padded_ids, mask, 0.25, batch_size=5)

    assert report.calibration_tokens == 4 * 16
    error = relative_error(logits(padded, ids), logits(plain, ids))
    assert error < TOLERANCE, f"padding changed the sliced model: relative logit error {error:.2e}"


def test_progress_is_reported_after_each_block_and_stop_is_honoured() -> None:
    calls: list[tuple[int, int]] = []
    model = build("llama_biases")  # 3 blocks
    slice_model(model, token_ids(2, 8), None, 0.25, progress=lambda done, total: calls.append((done, total)))
    assert calls == [(0, 3), (1, 3), (2, 3), (3, 3)]

    calls.clear()
    model = build("llama_biases")
    with pytest.raises(SlicingStopped, match="before block 2 of 3"):
        slice_model(
            model,
            token_ids(2, 8),
            None,
            0.25,
            progress=lambda done, total: calls.append((done, total)),
            should_stop=lambda: len(calls) > 2,
        )
    assert calls == [(0, 3), (1, 3), (2, 3)]


def test_report_records_widths_tokens_and_timings() -> None:
    model = build("qwen2")
    report = slice_model(model, token_ids(3, 8), None, 0.3, round_to=16)

    assert report.family == "llama"
    assert report.width == 32  # floor(0.7 * 64) = 44, rounded down to a multiple of 16
    assert report.widths.head == HIDDEN and report.widths.blocks[-1].out == HIDDEN
    assert [block.attn_in for block in report.widths.blocks] == [32, 32]
    assert report.calibration_tokens == 24 and report.calibration_sequences == 3
    assert len(report.timings["blocks"]) == 2 and report.timings["total"] > 0
    data = report.to_dict()
    assert data["param_fraction_removed"] == pytest.approx(1 - report.params_after / report.params_before)


def test_slicing_rejects_bad_inputs() -> None:
    model = build("llama")
    with pytest.raises(ValueError, match="sparsity"):
        slice_model(model, token_ids(2, 8), None, 1.0)
    with pytest.raises(ValueError, match=r"\(N, T\)"):
        slice_model(model, token_ids(2, 8)[0], None, 0.25)
    with pytest.raises(ValueError, match="no unpadded token"):
        slice_model(model, token_ids(2, 8), torch.zeros(2, 8, dtype=torch.long), 0.25)


def test_slicing_refuses_an_already_sliced_model() -> None:
    model = build("llama")
    slice_model(model, token_ids(2, 8), None, 0.25)

    assert detect_family(model).name == "llama"  # still recognised, e.g. for evaluation
    with pytest.raises(ValueError, match="already fused or sliced"):
        slice_model(model, token_ids(2, 8), None, 0.25)


@pytest.mark.parametrize(
    ("case", "parallel"), [("phi", True), ("gpt_neox", True), ("gpt_neox_sequential", False)]
)
def test_parallel_residual_blocks_get_one_skip_matrix(case: str, parallel: bool) -> None:
    model = build(case)
    slice_model(model, token_ids(4, 16, seed=1), None, 0.25)

    for block in detect_family(model).blocks(model):
        if parallel:
            assert isinstance(block, ParallelSkipConnectedBlock)
        else:
            assert isinstance(block, SkipConnectedBlock)
            assert block.attn_skip is not None and block.attn_skip.shape == (48, 48)


def _confine_residual_stream(model: torch.nn.Module, rank: int) -> None:
    """Make every residual writer (embeddings, attention and MLP outputs, their biases) write
    inside one random rank-`rank` subspace orthogonal to the all-ones vector (so that LayerNorm
    mean removal keeps it). The residual stream then never leaves that subspace. Where a branch
    ends at a norm of scale g (Gemma), its writers write inside diag(1/g) of the subspace, so that
    the norm's output, diag(g) times a multiple of theirs, is inside it."""
    adapter = detect_family(model)
    width = model.config.hidden_size
    generator = torch.Generator().manual_seed(7)
    basis = torch.randn(width, rank, generator=generator, dtype=torch.float64)
    basis -= basis.mean(dim=0, keepdim=True)  # orthogonal to the ones vector
    basis, _ = torch.linalg.qr(basis)
    projector = basis @ basis.T  # (D, D)
    with torch.no_grad():
        for embedding in adapter.embeddings(model):
            embedding.weight.copy_(embedding.weight.double() @ projector)
        for block in adapter.blocks(model):
            for branch in BRANCHES:
                norm = adapter.output_norm(block, branch)
                confine = projector
                if norm is not None:
                    scale, _ = adapter.norm_scale_shift(norm)
                    assert scale is not None
                    confine = projector / scale.double()[:, None]  # diag(1 / g) @ projector
                for writer in adapter.writers(block, branch):
                    set_weight_out_in(writer, confine @ weight_out_in(writer).double())
                    if writer.bias is not None:
                        writer.bias.copy_(writer.bias.double() @ confine.T)


@pytest.mark.parametrize("case", [*FAMILY_CASES, "gpt_neox_sequential"])
def test_slicing_a_stream_of_rank_d_to_width_d_preserves_logits(case: str) -> None:
    """Exercises every rotation, slice and skip matrix at s > 0: nothing is lost only if each PCA
    finds the subspace and every skip maps the right bases onto each other."""
    model = build(case)
    _confine_residual_stream(model, rank=48)
    ids = token_ids(3, 12, seed=2)
    expected = logits(model, ids)

    report = slice_model(model, token_ids(4, 16, seed=1), None, 0.25)

    assert report.width == 48
    error = relative_error(logits(model, ids), expected)
    assert error < TOLERANCE, f"{case}: relative logit error {error:.2e}"


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_passes_run_a_few_sequences_at_a_time_exactly_as_whole_batches(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The memory-saving chunked passes (engine.ACTIVATION_ROWS) give the sliced model the whole-batch
    passes give, with padding masks that must be cut with their sequences (batches of 5, 2 per chunk)."""
    calibration = torch.cat([token_ids(9, 16, seed=1), token_ids(9, 6, seed=5)], dim=1)  # (9, 22)
    mask = torch.ones_like(calibration)
    mask[::2, 16:] = 0  # every other sequence right-padded
    ids = token_ids(2, 12, seed=2)
    check = engine._check_block_structure
    chunks: list[int] = []
    monkeypatch.setattr(
        engine, "_check_block_structure", lambda *args: chunks.append(check(*args)) or chunks[-1]
    )
    models = {}
    for label, rows in (("whole", 10**6), ("chunked", 2 * 22)):
        monkeypatch.setattr(engine, "ACTIVATION_ROWS", rows)
        models[label] = build(case)
        slice_model(models[label], calibration, mask, 0.25, batch_size=5)
    assert chunks == [5, 2], "the passes did not run 2 sequences at a time"
    error = relative_error(logits(models["chunked"], ids), logits(models["whole"], ids))
    assert error < 1e-5, f"chunked passes changed the sliced model: relative logit error {error:.2e}"


@contextlib.contextmanager
def _in_the_original_basis(*_args: object) -> Iterator[bool]:
    yield False


@pytest.mark.parametrize("case", ["llama_biases", "opt", "gpt2", "phi", "gpt_neox_sequential"])
def test_passes_written_in_their_input_frame_slice_as_the_skip_products_do(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writing each pass in its input basis' frame (rotated writers, the kept input padded in) is a
    change of coordinates only: the sliced model equals the one whose passes run in the original
    basis through the skip products, and the writers keep no trace of the temporary rotation."""
    frames: list[bool] = []
    in_frame = block_slicing.writers_in_frame

    @contextlib.contextmanager
    def recorded(*args: Any) -> Iterator[bool]:
        with in_frame(*args) as framed:
            frames.append(framed)
            yield framed

    models = {}
    for label, frame in (("frames", recorded), ("skips", _in_the_original_basis)):
        monkeypatch.setattr(block_slicing, "writers_in_frame", frame)
        models[label] = build(case)
        slice_model(models[label], token_ids(6, 16, seed=1), None, 0.25, batch_size=4)
    assert frames and all(frames), "no pass ran in its input's frame"
    ids = token_ids(2, 12, seed=2)
    error = relative_error(logits(models["frames"], ids), logits(models["skips"], ids))
    assert error < 1e-5, f"{case}: frames changed the sliced model: relative logit error {error:.2e}"


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_a_bf16_model_sliced_at_zero_sparsity_stays_as_close_to_fp32_as_the_bf16_model_was(case: str) -> None:
    """The GPU path's dtype runs through every family's slicing (frames, skips, projected norms) and
    adds little to the rounding bf16 itself costs: measured 1.1-1.35x of it. A coarse guard: a
    bf16-rounded basis or stream rotation stays inside the bound on these tiny models."""
    ids = token_ids(3, 12, seed=2)
    exact = logits(build(case), ids)
    model = build(case).to(torch.bfloat16)
    rounding = relative_error(logits(model, ids).float(), exact)

    slice_model(model, token_ids(4, 16, seed=1), None, 0.0, batch_size=2)

    error = relative_error(logits(model, ids).float(), exact)
    assert error < 1.6 * rounding, (
        f"{case}: sliced bf16 {error:.2e} against the bf16 model's own {rounding:.2e}"
    )
