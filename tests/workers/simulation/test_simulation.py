"""A simulation is the pruned model, where it claims to be: at s = 0 the dense model, with the method's
own bases or statistics the pruned model itself, offloaded the same as resident."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from transformers import PreTrainedModel

from tests.workers.slicing.tiny import FAMILY_CASES, build, mean_nll, token_ids
from workers.architectures import match_structure
from workers.offload import offload
from workers.pruning import prune_model
from workers.simulation import ANCHOR, SIMULATED, SimulationOptions, SimulationReport, simulate_curve
from workers.slicing.engine import slice_model
from workers.slicing.stock import slice_model_stock

STOCK_CASES = ("llama", "mistral", "qwen2", "qwen3", "phi3")
CALIBRATION = token_ids(8, 24, seed=1)
EVALUATION = token_ids(3, 24, seed=2)


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """Tiny models: one torch thread (tests/workers/conftest.py)."""


def _ppl(report: SimulationReport, role: str) -> dict[float, float]:
    return {point.sparsity: point.scores.ppl for point in report.points if point.role == role}


def _measured(model: PreTrainedModel) -> float:
    return math.exp(mean_nll(model, EVALUATION))


def _simulate(
    model: PreTrainedModel, method: str, sparsities: list[float], **kwargs: object
) -> SimulationReport:
    anchors = kwargs.pop("anchors", ())
    options = SimulationOptions(calibration_batch_size=3, eval_batch_size=2, **kwargs)  # type: ignore[arg-type]
    return simulate_curve(
        model, method, EVALUATION, sparsities, anchors=anchors, calibration_ids=CALIBRATION, options=options
    )


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_slicing_simulated_at_zero_sparsity_is_the_dense_model(case: str) -> None:
    model = build(case)
    dense = _measured(model)
    for bases in ("sequential", "dense"):
        simulated = _ppl(_simulate(model, "slicegpt", [0.0], bases=bases, round_to=1), SIMULATED)
        assert simulated[0.0] == pytest.approx(dense, rel=1e-5)


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_slicing_anchor_equals_the_engines_sliced_model(case: str) -> None:
    """An anchor takes SliceGPT's own bases (the projected stream of every calibration window), so it
    scores what the engine's sliced model scores; the dense-stream bases do not."""
    model = build(case)
    report = _simulate(model, "slicegpt", [0.25], bases="dense", anchors=[0.25])
    sliced = copy.deepcopy(model)
    slice_model(sliced, CALIBRATION, None, 0.25, batch_size=3)
    measured = _measured(sliced)
    assert _ppl(report, ANCHOR)[0.25] == pytest.approx(measured, rel=1e-4)
    assert _ppl(report, SIMULATED)[0.25] != pytest.approx(measured, rel=1e-4)


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_sequential_bases_from_a_subset_are_slicings_on_that_subset(case: str) -> None:
    """A sequential stream over the first windows runs at its sliced width through sliced copies of
    the blocks: what it simulates is the model slicing those windows alone gives."""
    model = build(case)
    report = _simulate(model, "slicegpt", [0.25, 0.5], basis_windows=3)
    assert report.basis_windows == 3
    simulated = _ppl(report, SIMULATED)
    for sparsity in (0.25, 0.5):
        sliced = copy.deepcopy(model)
        slice_model(sliced, CALIBRATION[:3], None, sparsity, batch_size=3)
        assert simulated[sparsity] == pytest.approx(_measured(sliced), rel=1e-4)


@pytest.mark.parametrize("case", STOCK_CASES)
def test_stock_simulation_equals_the_stock_sliced_model(case: str) -> None:
    model = build(case)
    report = _simulate(model, "slicegpt", [0.25, 0.5], layout="stock")
    for sparsity, simulated in _ppl(report, SIMULATED).items():
        sliced = copy.deepcopy(model)
        slice_model_stock(sliced, CALIBRATION, None, sparsity, batch_size=3)
        assert simulated == pytest.approx(_measured(sliced), rel=1e-4)


@pytest.mark.parametrize("case", ["llama", "opt", "gpt2", "gemma3"])
@pytest.mark.parametrize("method", ["magnitude", "magnitude-row", "wanda", "sparsegpt"])
def test_masked_forward_equals_the_pruned_model(case: str, method: str) -> None:
    """Magnitude's simulation is its pruned model; Wanda's and SparseGPT's anchors (their own statistics
    of the pruned stream, SparseGPT's update included) are theirs."""
    model = build(case)
    report = _simulate(model, method, [0.5], anchors=[0.5])
    pruned = copy.deepcopy(model)
    prune_model(pruned, method, 0.5, calibration_ids=CALIBRATION, batch_size=3)
    measured = _measured(pruned)
    assert _ppl(report, ANCHOR)[0.5] == pytest.approx(measured, rel=1e-4)
    if method.startswith("magnitude"):
        assert _ppl(report, SIMULATED)[0.5] == pytest.approx(measured, rel=1e-4)


def test_a_simulation_leaves_the_model_unchanged() -> None:
    model = build("llama")
    before = {name: p.detach().clone() for name, p in model.state_dict().items()}
    _simulate(model, "sparsegpt", [0.3, 0.6], anchors=[0.5])
    _simulate(model, "slicegpt", [0.3], anchors=[0.5])
    for name, parameter in model.state_dict().items():
        assert torch.equal(parameter, before[name]), name


@pytest.mark.parametrize("method", ["slicegpt", "wanda"])
def test_offloaded_simulation_equals_resident(method: str) -> None:
    resident = _ppl(_simulate(build("llama"), method, [0.2, 0.4], anchors=[0.3]), SIMULATED)
    model = build("llama")
    offload(model, match_structure(model).blocks(model), torch.device("cpu"))
    streamed = _ppl(_simulate(model, method, [0.2, 0.4], anchors=[0.3]), SIMULATED)
    assert streamed == pytest.approx(resident, rel=1e-6)


def test_window_scores_match_the_protocols_perplexity() -> None:
    """Per-window NLL sums add up to the protocol's perplexity; their means average to ln PPL."""
    model = build("llama")
    scores = _simulate(model, "magnitude", [0.0]).points[0].scores
    assert scores.tokens == EVALUATION.shape[0] * (EVALUATION.shape[1] - 1)
    assert scores.ppl == pytest.approx(_measured(model), rel=1e-6)
    assert math.exp(sum(scores.per_window) / len(scores.per_window)) == pytest.approx(scores.ppl)


@pytest.mark.parametrize("width", [0, 3, 4, 5, 8])
def test_projection_keeps_the_top_directions_whichever_side_it_computes(width: int) -> None:
    from workers.simulation.projection import project

    generator = torch.Generator().manual_seed(0)
    basis = torch.linalg.qr(torch.randn(8, 8, generator=generator, dtype=torch.float64))[0]
    hidden = torch.randn(2, 3, 8, generator=generator, dtype=torch.float64)
    expected = hidden @ basis[:, :width] @ basis[:, :width].T
    assert torch.allclose(project(hidden, basis, width), expected)
