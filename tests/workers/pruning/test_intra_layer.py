"""Magnitude, Wanda and SparseGPT on whole tiny models and on single constructed layers."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from tests.workers.pruning.tiny import build, calibration, weights_by_name
from workers.pruning import prune_model
from workers.pruning.linears import block_linears
from workers.pruning.magnitude import prune_linear_by_magnitude
from workers.pruning.masks import select_mask
from workers.pruning.sparsegpt import HessianAccumulator, sparsegpt_prune
from workers.pruning.wanda import FeatureSquares, prune_linear_by_wanda, wanda_scores

INTRA = ("magnitude", "wanda", "sparsegpt")


@pytest.mark.parametrize("case", ["llama", "gpt2", "opt"])  # gpt2: Conv1D weights stored (in, out)
@pytest.mark.parametrize("method", INTRA)
@pytest.mark.parametrize(("pattern", "n", "m"), [("2:4", 2, 4), ("4:8", 4, 8)])
def test_n_m_patterns_zero_exactly_n_of_every_m_inputs_in_every_row(
    case: str, method: str, pattern: str, n: int, m: int
) -> None:
    model = build(case)
    report = prune_model(model, method, n / m, pattern=pattern, calibration_ids=calibration())
    weights = weights_by_name(model)
    assert len(weights) >= 8
    for name, weight in weights.items():
        out, columns = weight.shape
        zeros = (weight == 0).reshape(out, columns // m, m).sum(-1)  # (out, in / m)
        assert bool((zeros == n).all()), name
    assert report.achieved_sparsity == pytest.approx(n / m, abs=1e-12)


@pytest.mark.parametrize("case", ["llama", "gpt2"])
@pytest.mark.parametrize("method", [*INTRA, "magnitude-row"])
def test_unstructured_zeroes_floor_of_sparsity_of_every_row_or_layer(case: str, method: str) -> None:
    """Wanda and magnitude-row compare within a row; SparseGPT within a block of columns (as the
    reference), so only its layer total is fixed: floor(s * in) per row on average, exactly;
    magnitude across the whole layer: floor(s * out * in) in all, rows uneven."""
    model = build(case)
    prune_model(model, method, 0.3, calibration_ids=calibration())
    for name, weight in weights_by_name(model).items():
        expected = math.floor(0.3 * weight.shape[1])
        zeros = (weight == 0).sum(1)
        if method == "magnitude":
            assert int(zeros.sum()) == math.floor(0.3 * weight.numel() + 1e-9), name
            assert zeros.min() < zeros.max(), name  # one threshold for the layer: rows differ
        elif method == "sparsegpt":
            assert int(zeros.sum()) == expected * weight.shape[0], name
            assert zeros.min() < zeros.max(), name  # rows differ: the block, not the row, decides
        else:
            assert zeros.tolist() == [expected] * weight.shape[0], name


def test_magnitude_prunes_the_smallest_weights_of_the_layer_and_magnitude_row_of_each_row() -> None:
    weights = torch.tensor([[0.1, 0.2, 5.0, 6.0], [3.0, 4.0, 7.0, 8.0]])  # row 0 holds the small ones
    layer, by_row = nn.Linear(4, 2, bias=False), nn.Linear(4, 2, bias=False)
    with torch.no_grad():
        layer.weight.copy_(weights)
        by_row.weight.copy_(weights)
    assert prune_linear_by_magnitude(layer, 0.25, "unstructured").tolist() == [
        [True, True, False, False],
        [False, False, False, False],
    ]
    assert prune_linear_by_magnitude(by_row, 0.25, "unstructured", per_row=True).tolist() == [
        [True, False, False, False],
        [True, False, False, False],
    ]


@pytest.mark.parametrize("case", ["llama", "gpt2"])
@pytest.mark.parametrize("method", INTRA)
def test_zero_sparsity_preserves_logits(case: str, method: str) -> None:
    model = build(case)
    ids = calibration()
    with torch.no_grad():
        before = model(input_ids=ids).logits
    report = prune_model(model, method, 0.0, calibration_ids=ids)
    with torch.no_grad():
        after = model(input_ids=ids).logits
    assert torch.equal(before, after)
    assert report.params_after == report.params_before and report.achieved_sparsity == 0.0


def test_wanda_keeps_a_small_weight_on_a_large_input_over_a_larger_weight_on_a_small_input() -> None:
    layer = nn.Linear(4, 1, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[0.1, 1.0, 2.0, 3.0]]))
    inputs = torch.tensor([[100.0, 1.0, 1.0, 1.0], [-100.0, 1.0, 1.0, 1.0]])  # (tokens, in)
    statistics = FeatureSquares(4, torch.device("cpu"))
    statistics.add(inputs)
    assert wanda_scores(layer.weight, statistics.norms)[0, :2].tolist() == pytest.approx(
        [0.1 * math.sqrt(2e4), 1.0 * math.sqrt(2.0)]
    )
    mask = prune_linear_by_wanda(layer, statistics, 0.25, "unstructured")
    assert mask.tolist() == [[False, True, False, False]]  # column 1 goes, not column 0
    assert layer.weight[0].tolist() == pytest.approx([0.1, 0.0, 2.0, 3.0])
    magnitude_layer = nn.Linear(4, 1, bias=False)
    with torch.no_grad():
        magnitude_layer.weight.copy_(torch.tensor([[0.1, 1.0, 2.0, 3.0]]))
    assert prune_linear_by_magnitude(magnitude_layer, 0.25, "unstructured").tolist() == [
        [True, False, False, False]
    ]


def _correlated_layer(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight (32, 64) and inputs (1024, 64) with strongly correlated, unevenly scaled features."""
    generator = torch.Generator().manual_seed(seed)
    latent = torch.randn(1024, 16, generator=generator, dtype=torch.float64)
    mixing = torch.randn(16, 64, generator=generator, dtype=torch.float64)
    scales = torch.logspace(-0.5, 0.5, 64, dtype=torch.float64)  # features of uneven size
    inputs = (
        latent @ mixing + 0.1 * torch.randn(1024, 64, generator=generator, dtype=torch.float64)
    ) * scales
    weight = torch.randn(32, 64, generator=generator, dtype=torch.float64)
    return weight, inputs


def _reconstruction_error(weight: torch.Tensor, pruned: torch.Tensor, inputs: torch.Tensor) -> float:
    return float((inputs @ weight.T - inputs @ pruned.T).norm())  # ||W X - W' X||_F


@pytest.mark.parametrize(("sparsity", "pattern"), [(0.5, "unstructured"), (0.5, "2:4")])
def test_sparsegpt_reconstructs_a_layer_better_than_magnitude_and_wanda(
    sparsity: float, pattern: str
) -> None:
    weight, inputs = _correlated_layer()
    hessian = HessianAccumulator(64, torch.device("cpu"), dtype=torch.float64)
    for chunk in inputs.split(100):  # the running mean must equal 2/n X^T X whatever the chunking
        hessian.add(chunk)
    assert torch.allclose(hessian.matrix, 2.0 / 1024 * inputs.T @ inputs)
    pruned, mask = sparsegpt_prune(weight, hessian.matrix, sparsity, pattern)
    assert bool((pruned[mask] == 0).all()) and int(mask.sum()) == 32 * 32
    assert bool((pruned[~mask] != 0).all())

    magnitude = weight.masked_fill(select_mask(weight.abs(), sparsity, pattern), 0.0)
    norms = inputs.pow(2).sum(0).sqrt()
    wanda = weight.masked_fill(select_mask(wanda_scores(weight, norms), sparsity, pattern), 0.0)
    errors = {
        name: _reconstruction_error(weight, candidate, inputs)
        for name, candidate in (("sparsegpt", pruned), ("magnitude", magnitude), ("wanda", wanda))
    }
    assert errors["sparsegpt"] < 0.9 * errors["wanda"], errors
    assert errors["wanda"] < errors["magnitude"], errors


def test_sparsegpt_at_zero_sparsity_returns_the_weight_and_zeroes_dead_inputs() -> None:
    weight, inputs = _correlated_layer(seed=1)
    inputs[:, 5] = 0.0  # an input that never fires
    hessian = 2.0 / inputs.shape[0] * inputs.T @ inputs
    pruned, mask = sparsegpt_prune(weight, hessian, 0.0)
    assert not mask.any()
    assert bool((pruned[:, 5] == 0).all())
    keep = torch.ones(64, dtype=torch.bool)
    keep[5] = False
    assert torch.equal(pruned[:, keep], weight[:, keep])


def test_sparsegpt_unstructured_fraction_is_exact_per_block_across_uneven_blocks() -> None:
    weight, inputs = _correlated_layer(seed=2)
    hessian = 2.0 / inputs.shape[0] * inputs.T @ inputs
    _, mask = sparsegpt_prune(weight, hessian, 0.3, blocksize=24)  # blocks of 24, 24, 16 columns
    per_block = [int(mask[:, start : start + 24].sum()) for start in (0, 24, 48)]
    shares = [math.floor(0.3 * end) - math.floor(0.3 * start) for start, end in ((0, 24), (24, 48), (48, 64))]
    assert per_block == [32 * share for share in shares]
    assert int(mask.sum()) == 32 * math.floor(0.3 * 64)


def test_padded_positions_do_not_enter_wanda_statistics() -> None:
    ids = calibration(rows=3, length=12)
    padded = torch.cat([ids, calibration(rows=3, length=5, seed=9)], dim=1)  # garbage on the right
    mask = torch.cat([torch.ones(3, 12), torch.zeros(3, 5)], dim=1).long()
    clean, noisy = build("llama"), build("llama")
    prune_model(clean, "wanda", 0.5, calibration_ids=ids)
    prune_model(noisy, "wanda", 0.5, calibration_ids=padded, attention_mask=mask)
    unpadded_but_unmasked = build("llama")
    prune_model(unpadded_but_unmasked, "wanda", 0.5, calibration_ids=padded)
    clean_w, noisy_w = weights_by_name(clean), weights_by_name(noisy)
    for name, weight in clean_w.items():
        assert torch.equal(weight == 0, noisy_w[name] == 0), name
    other = weights_by_name(unpadded_but_unmasked)
    assert any(not torch.equal(weight == 0, other[name] == 0) for name, weight in clean_w.items())


def test_statistics_in_row_chunks_with_padding_zeroed_equal_the_whole_selection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import workers.pruning.stream as stream

    generator = torch.Generator().manual_seed(3)
    rows = torch.randn(257, 24, generator=generator)
    keep = torch.rand(257, generator=generator) > 0.3
    monkeypatch.setattr(stream, "ROW_CHUNK_ELEMENTS", 24 * 10)  # 26 chunks, the last one short
    squares, hessian = FeatureSquares(24, torch.device("cpu")), HessianAccumulator(24, torch.device("cpu"))
    squares.add(rows, keep)
    hessian.add(rows, keep)
    kept = rows[keep].double()
    assert squares.tokens == hessian.tokens == int(keep.sum())
    # Each square rounds once in float32 (2^-24 relative), the sums accumulate in float64.
    assert squares.sums.dtype == torch.float64
    assert torch.allclose(squares.sums, kept.pow(2).sum(0), rtol=2**-23, atol=0)
    assert torch.allclose(hessian.matrix.double(), 2.0 / len(kept) * kept.T @ kept, rtol=1e-5, atol=1e-6)


def test_linears_reading_one_input_share_one_statistic() -> None:
    from workers.architectures import match_structure
    from workers.pruning.sequential import input_statistics
    from workers.pruning.stream import capture

    model = build("llama")
    adapter = match_structure(model)
    ids = calibration()
    cpu = torch.device("cpu")
    batches = capture(model, adapter, ids, torch.ones_like(ids, dtype=torch.bool), 2, cpu, cpu)
    block = adapter.blocks(model)[0]
    linears = block_linears(adapter, block)
    statistics = input_statistics(linears, batches, 0, block, HessianAccumulator, cpu)
    groups: dict[int, list[str]] = {}
    for path, statistic in statistics.items():
        groups.setdefault(id(statistic), []).append(path)
    assert sorted(groups.values()) == [
        ["mlp.down_proj"],
        ["mlp.gate_proj", "mlp.up_proj"],
        ["self_attn.o_proj"],
        ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
    ]
    assert all(statistic.tokens == ids.numel() for statistic in statistics.values())
