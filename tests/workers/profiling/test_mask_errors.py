"""The profile's mask errors are what the pruners' own masks would remove from each linear's output
on the dense model's inputs, and a family slicing refuses still gets them."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from transformers import PreTrainedModel

from core.profiles import MASK_RULES
from tests.workers.pruning.tiny import build, calibration
from workers.architectures import match_structure
from workers.profiling import profile_model
from workers.pruning.linears import block_linears, weight_out_in
from workers.pruning.magnitude import prune_linear_by_magnitude
from workers.pruning.wanda import FeatureSquares, prune_linear_by_wanda

SPARSITIES = [0.25, 0.5]


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """Tiny models: one torch thread (tests/workers/conftest.py)."""


def _dense_inputs(model: PreTrainedModel, ids: torch.Tensor, layer: int) -> dict[str, torch.Tensor]:
    """Every linear of block `layer`'s input rows (n, in) in a full dense forward."""
    adapter = match_structure(model)
    linears = block_linears(adapter, adapter.blocks(model)[layer])
    rows: dict[str, torch.Tensor] = {}

    def hook(path: str):  # type: ignore[no-untyped-def]
        def record(_module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            rows[path] = args[0].reshape(-1, args[0].shape[-1]).detach().double()

        return record

    handles = [module.register_forward_pre_hook(hook(path)) for path, module in linears]
    with torch.no_grad():
        model(input_ids=ids)
    for handle in handles:
        handle.remove()
    return rows


def _pruned_copy(module: nn.Module, rule: str, rows: torch.Tensor, sparsity: float) -> torch.Tensor:
    """The linear's weight (out, in) after the pruner of `rule` pruned a copy of it."""
    copied = copy.deepcopy(module)
    if rule == "wanda":
        squares = FeatureSquares(rows.shape[1], torch.device("cpu"))
        squares.add(rows.float())
        prune_linear_by_wanda(copied, squares, sparsity, "unstructured")
    else:
        prune_linear_by_magnitude(copied, sparsity, "unstructured", per_row=rule == "magnitude-row")
    return weight_out_in(copied).detach().double()


@pytest.mark.parametrize(
    ("case", "blocks_of", "chunk_bytes"),
    [("llama", None, None), ("gemma3", None, None), ("llama", 5, 4096)],
    ids=["llama", "gemma3", "llama-column-blocks-row-chunks"],
)
def test_each_error_is_the_output_share_the_pruners_own_mask_removes(
    case: str, blocks_of: int | None, chunk_bytes: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last case splits the tiny model's moments into column blocks of 5 and its masked rows
    into chunks of a few rows, as a real model's are split."""
    from workers.profiling import mask_errors

    if blocks_of is not None:
        monkeypatch.setattr(mask_errors, "MIN_BLOCK_COLUMNS", blocks_of)
    if chunk_bytes is not None:
        monkeypatch.setattr(mask_errors, "ROW_CHUNK_BYTES", chunk_bytes)
    model = build(case, layers=2)
    ids = calibration(4, 16)
    report = profile_model(model, ids, None, SPARSITIES, batch_size=2, lens_tokens=0)
    layer = 1
    inputs = _dense_inputs(model, ids, layer)
    linears = dict(block_linears(match_structure(model), match_structure(model).blocks(model)[layer]))
    measured = [e for e in report.linears if e.layer == layer]
    assert [e.name for e in measured] == list(linears)
    assert report.mask_rules == list(MASK_RULES)
    for entry in measured:
        module, x = linears[entry.name], inputs[entry.name]
        weight = weight_out_in(module).detach().double()
        dense_out = x @ weight.T
        assert entry.output_energy == pytest.approx(float(dense_out.pow(2).sum(1).mean()), rel=1e-4)
        for rule in MASK_RULES:
            for s, error in zip(SPARSITIES, entry.errors[rule], strict=True):
                pruned_out = x @ _pruned_copy(module, rule, x, s).T
                expected = float((dense_out - pruned_out).pow(2).sum() / dense_out.pow(2).sum())
                assert error == pytest.approx(expected, rel=1e-3, abs=1e-7), (entry.name, rule, s)
                assert 0.0 < error < 1.0


def test_a_family_slicing_refuses_is_profiled_whole_with_its_refusal() -> None:
    model = build("gemma1")
    ids = calibration(4, 16)
    report = profile_model(model, ids, None, SPARSITIES, batch_size=2, lens_tokens=8)
    assert report.slicing_refusal is not None and "(1 + weight)" in report.slicing_refusal
    assert [s.kind for s in report.signals] == ["embedding"] + ["output"] * report.num_layers
    with torch.no_grad():
        hidden = model(input_ids=ids, output_hidden_states=True).hidden_states  # embeddings, then blocks
    for signal in report.signals[1:-1]:  # the last hidden state is after the final norm
        x = hidden[signal.index].double().reshape(-1, hidden[signal.index].shape[-1])
        expected = torch.linalg.eigvalsh(x.T @ x / x.shape[0]).flip(0)
        assert torch.allclose(
            torch.tensor(signal.eigenvalues, dtype=torch.float64), expected, rtol=1e-4, atol=1e-6
        )
    assert len(report.linears) == report.num_layers * 7


def test_no_mask_rules_measure_no_errors() -> None:
    report = profile_model(build("llama"), calibration(2, 16), None, [0.5], lens_tokens=0, mask_rules=())
    assert report.linears == [] and report.mask_rules == []


def test_the_moment_samples_every_kth_real_token_across_batches_and_squares_every_one() -> None:
    from workers.profiling.mask_errors import MaskMoment

    generator = torch.Generator().manual_seed(0)
    rows = torch.randn(4000, 8, generator=generator) @ torch.randn(8, 8, generator=generator)
    keep = torch.rand(4000, generator=generator) > 0.25
    whole = MaskMoment(8, torch.device("cpu"), stride=5)
    whole.add(rows, keep)
    split = MaskMoment(8, torch.device("cpu"), stride=5)
    split.add(rows[:1001], keep[:1001])
    split.add(rows[1001:], keep[1001:])
    real = rows[keep].double()
    assert torch.allclose(whole.squares, real.pow(2).sum(0)) and torch.allclose(split.squares, whole.squares)
    assert split.sampled == whole.sampled == len(range(0, real.shape[0], 5))
    assert torch.allclose(split.covariance, whole.covariance, rtol=1e-5)
    sampled = real[::5]  # every 5th real token, counted across the split
    assert torch.allclose(whole.covariance.double(), sampled.T @ sampled / sampled.shape[0], rtol=1e-5)
    exact = (real.T @ real / real.shape[0]).float()
    assert torch.allclose(whole.covariance, exact, rtol=0.15, atol=0.15 * float(exact.diagonal().mean()))


def test_errors_on_a_token_sample_stay_close_to_the_exact_ones() -> None:
    model = build("llama", layers=2)
    ids = calibration(8, 32)
    exact = profile_model(model, ids, None, SPARSITIES, batch_size=4, lens_tokens=0)
    from workers.profiling import mask_errors

    original = mask_errors.MASK_TOKENS
    mask_errors.MASK_TOKENS = 64  # every 4th of the 256 tokens
    try:
        sampled = profile_model(model, ids, None, SPARSITIES, batch_size=4, lens_tokens=0)
    finally:
        mask_errors.MASK_TOKENS = original
    for a, b in zip(exact.linears, sampled.linears, strict=True):
        for rule in MASK_RULES:
            assert b.errors[rule] == pytest.approx(a.errors[rule], rel=0.25)
            assert b.errors[rule] != a.errors[rule]


@pytest.mark.parametrize("columns", [7, 256, 700, 1100])
def test_the_upper_block_triangle_gives_every_row_its_full_quadratic_form(columns: int) -> None:
    from workers.profiling.mask_errors import MIN_BLOCK_COLUMNS, quadratic_forms

    generator = torch.Generator().manual_seed(columns)
    x = torch.randn(3 * columns, columns, generator=generator, dtype=torch.float64)
    moment = x.T @ x / x.shape[0]  # symmetric, positive definite
    rows = torch.randn(40, columns, generator=generator, dtype=torch.float64)
    expected = ((rows @ moment) * rows).sum(dim=1)
    assert torch.allclose(quadratic_forms(rows, moment), expected, rtol=1e-12)
    if columns < 2 * MIN_BLOCK_COLUMNS:
        return  # one block: the plain product
    tilted = moment.clone()
    tilted[0, -1] += 1.0  # the lower block triangle is never read: only an upper entry moves the forms
    assert torch.allclose(quadratic_forms(rows, tilted), expected + rows[:, 0] * rows[:, -1] * 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("per_row", [True, False])
def test_ranks_follow_a_stable_sort_of_the_scores_ties_in_index_order(
    dtype: torch.dtype, per_row: bool
) -> None:
    from workers.profiling.mask_errors import pruning_ranks

    generator = torch.Generator().manual_seed(1)
    scores = torch.randn(6, 50, generator=generator, dtype=dtype).abs()
    scores[:, ::7] = 0.0  # ties, at the bottom
    scores[2, 10:20] = 0.5  # and in the middle of one row
    scores[4, :] = torch.linspace(1e-30, 3e30, 50, dtype=dtype)  # magnitudes far apart
    ranks = pruning_ranks(scores, per_row)
    grouped = scores if per_row else scores.reshape(1, -1)
    order = torch.sort(grouped, dim=-1, stable=True).indices
    expected = torch.empty_like(order).scatter_(-1, order, torch.arange(order.shape[-1]).expand_as(order))
    assert torch.equal(ranks, expected.view(scores.shape))
