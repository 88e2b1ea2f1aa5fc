"""Steps 1-4 of SliceGPT: fusing norms and rotating the residual stream leave the model unchanged."""

from __future__ import annotations

import math

import pytest
import torch

from tests.workers.slicing.tiny import ALL_CASES, build, logits, mean_nll, relative_error, token_ids
from workers.slicing.adapters import detect_family
from workers.slicing.fusion import fuse_model
from workers.slicing.portable.sliced_modules import RMSNormNoScale
from workers.slicing.rotation import random_orthogonal, rotate_fused_model

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
