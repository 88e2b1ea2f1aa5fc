"""Steps 1-4 of SliceGPT: fusing norms and rotating the residual stream leave the model unchanged."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.pytorch_utils import Conv1D

from tests.workers.slicing.tiny import ALL_CASES, build, logits, mean_nll, relative_error, token_ids
from workers.architectures import detect_family
from workers.slicing.fusion import fuse_final_norm, fuse_model
from workers.slicing.portable.sliced_modules import RMSNormNoScale
from workers.slicing.portable.sliced_weights import weight_out_in
from workers.slicing.rotation import random_orthogonal, rotate_fused_model, writers_in_frame

TOLERANCE = 1e-4  # relative Frobenius error of the logits


@pytest.mark.parametrize("case", ALL_CASES)
def test_fusing_norms_preserves_logits(case: str) -> None:
    model = build(case)
    ids = token_ids(3, 12)
    expected = logits(model, ids)
    adapter = detect_family(model)

    fuse_model(model, adapter)

    assert all(isinstance(norm, RMSNormNoScale) for norm in [adapter.final_norm(model)])
    assert adapter.lm_head(model).weight.data_ptr() != adapter.embeddings(model)[0].weight.data_ptr()
    assert relative_error(logits(model, ids), expected) < TOLERANCE


@pytest.mark.parametrize("case", ALL_CASES)
def test_fused_model_rotated_by_random_orthogonal_matrix_preserves_logits(case: str) -> None:
    model = build(case)
    ids = token_ids(3, 12)
    expected = logits(model, ids)
    adapter = detect_family(model)
    fuse_model(model, adapter)

    rotate_fused_model(model, adapter, random_orthogonal(model.config.hidden_size, seed=1))

    error = relative_error(logits(model, ids), expected)
    assert error < TOLERANCE, f"{case}: relative logit error {error:.2e}"


@pytest.mark.parametrize("case", ["llama", "opt", "gpt2"])
def test_final_norm_fused_with_a_rotation_is_the_fused_head_rotated(case: str) -> None:
    """Slicing folds the final norm and rotates the head in one copy: W diag(scale) Q[:, :k], the
    head's bias folded from the norm's shift as without a rotation, and the table left dense."""
    plain, rotated = build(case), build(case)
    adapter = detect_family(plain)
    width = plain.config.hidden_size
    basis = random_orthogonal(width, seed=5)
    keep = width - 8
    table = adapter.embeddings(rotated)[0].weight.detach().clone()

    fuse_final_norm(plain, adapter, width, torch.device("cpu"))
    fuse_final_norm(rotated, adapter, width, torch.device("cpu"), rotation=basis[:, :keep])

    head, expected = adapter.lm_head(rotated), adapter.lm_head(plain)
    folded_then_rotated = weight_out_in(expected).double() @ basis[:, :keep]
    assert torch.allclose(weight_out_in(head).double(), folded_then_rotated, atol=1e-5)
    if expected.bias is not None:
        assert torch.equal(head.bias, expected.bias)
    assert torch.equal(adapter.embeddings(rotated)[0].weight, table)
    assert isinstance(adapter.final_norm(rotated), RMSNormNoScale)


@pytest.mark.parametrize("case", ["llama", "opt", "gpt2"])
def test_fused_perplexity_equals_dense_perplexity(case: str) -> None:
    model = build(case)
    ids = token_ids(4, 16, seed=3)
    dense = math.exp(mean_nll(model, ids))

    fuse_model(model, detect_family(model))

    assert math.exp(mean_nll(model, ids)) == pytest.approx(dense, rel=1e-5)


def test_rotation_refuses_an_unfused_model() -> None:
    model = build("llama")
    with pytest.raises(ValueError, match="fused"):
        rotate_fused_model(
            model, detect_family(model), torch.eye(model.config.hidden_size, dtype=torch.float64)
        )


def test_rms_norm_no_scale_divides_by_the_original_width() -> None:
    norm = RMSNormNoScale(full_width=8, eps=0.0)
    x = torch.tensor([[3.0, 4.0]])  # sliced to 2 of 8 dimensions; sum of squares 25

    expected = x / math.sqrt(25 / 8)
    torch.testing.assert_close(norm(x), expected)


@pytest.mark.parametrize(("case", "frames"), [("llama_biases", True), ("gpt2", True), ("gemma3", False)])
def test_writers_in_frame_write_q_t_w_inside_and_are_the_same_parameters_after(
    case: str, frames: bool
) -> None:
    """Inside, every writer of the branch holds Q^T W (and its bias b Q) at full width; after, the
    original parameters themselves are back. A branch ending at a norm (Gemma) is left alone."""
    model = build(case)
    adapter = detect_family(model)
    block = adapter.blocks(model)[0]
    writers = adapter.writers(block, "mlp")
    before = [(writer.weight, writer.bias) for writer in writers]
    basis = random_orthogonal(model.config.hidden_size, seed=3)
    with writers_in_frame(adapter, block, ("mlp",), basis) as framed:
        assert framed is frames
        for writer, (weight, bias) in zip(writers, before, strict=True):
            expected = basis.T @ _as_out_in(weight, writer) if frames else _as_out_in(weight, writer)
            assert torch.allclose(weight_out_in(writer).double(), expected, atol=1e-5)
            if bias is not None:
                assert torch.allclose(
                    writer.bias.double(), bias.double() @ basis if frames else bias.double()
                )
    assert all(
        writer.weight is weight and writer.bias is bias
        for writer, (weight, bias) in zip(writers, before, strict=True)
    )


def _as_out_in(weight: torch.Tensor, writer: torch.nn.Module) -> torch.Tensor:
    """A stored weight as [out, in] float64, whatever the module stores (GPT-2's Conv1D: [in, out])."""
    return (weight.t() if isinstance(writer, Conv1D) else weight).double()
