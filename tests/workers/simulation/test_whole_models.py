"""A simulated sparsity as a whole model (workers.simulation.whole_models), what task scoring runs: it
gives, through the model's own forward, exactly what the simulation's block streams scored, on every
family; magnitude's is the pruned model; it leaves the model as it found it, offloaded or not."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from transformers import PreTrainedModel

from tests.workers.slicing.tiny import FAMILY_CASES, build, logits, mean_nll, token_ids
from workers.architectures import match_structure
from workers.offload import offload, offloaded
from workers.pruning import prune_model
from workers.simulation import SIMULATED, SimulationOptions, SimulationReport, simulate_curve
from workers.simulation.whole_models import MaskedModel, ProjectedModel

CALIBRATION = token_ids(8, 24, seed=1)
EVALUATION = token_ids(3, 24, seed=2)
STOCK_CASES = ("llama", "qwen2")


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """Tiny models: one torch thread (tests/workers/conftest.py)."""


def _kept(model: PreTrainedModel, method: str, sparsities: list[float], **kwargs: object) -> SimulationReport:
    options = SimulationOptions(calibration_batch_size=3, eval_batch_size=2, keep_models=True, **kwargs)  # type: ignore[arg-type]
    return simulate_curve(model, method, EVALUATION, sparsities, calibration_ids=CALIBRATION, options=options)


def _faces(report: SimulationReport) -> dict[float, float]:
    return {point.sparsity: point.scores.ppl for point in report.points if point.role == SIMULATED}


def _whole_model_ppl(model: PreTrainedModel, report: SimulationReport) -> dict[float, float]:
    scored = {}
    for simulated in report.models:
        with simulated.applied(model):
            scored[simulated.sparsity] = math.exp(mean_nll(model, EVALUATION))
    return scored


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_a_projected_whole_model_scores_what_the_streams_scored(case: str) -> None:
    """Sequential bases on every family, the sliced head's last signal included where the family
    slices it; 0.0 is the dense model. A wrapper that skipped one signal's projection, or projected
    the embedding twice, would move these by far more than float rounding."""
    model = build(case)
    report = _kept(model, "slicegpt", [0.0, 0.25, 0.5], round_to=1)
    assert [type(m) for m in report.models] == [ProjectedModel] * 3
    scored = _whole_model_ppl(model, report)
    assert scored == pytest.approx(_faces(report), rel=1e-5)
    assert scored[0.0] == pytest.approx(math.exp(mean_nll(model, EVALUATION)), rel=1e-5)
    assert scored[0.5] != pytest.approx(scored[0.0], rel=1e-3)  # the projection did something


@pytest.mark.parametrize("case", STOCK_CASES)
def test_a_stock_whole_model_scores_what_the_streams_scored(case: str) -> None:
    model = build(case)
    report = _kept(model, "slicegpt", [0.25], layout="stock")
    assert _whole_model_ppl(model, report) == pytest.approx(_faces(report), rel=1e-5)


@pytest.mark.parametrize("case", ["llama", "opt", "gpt2", "gemma3"])
@pytest.mark.parametrize("method", ["magnitude", "wanda", "sparsegpt"])
def test_a_masked_whole_model_scores_what_the_streams_scored(case: str, method: str) -> None:
    """Wanda's face masks read the dense stream's input norms the simulation recorded (SparseGPT's face
    is that Wanda mask); magnitude's whole model is the pruned model itself."""
    model = build(case)
    report = _kept(model, method, [0.3, 0.6])
    assert [type(m) for m in report.models] == [MaskedModel] * 2
    scored = _whole_model_ppl(model, report)
    assert scored == pytest.approx(_faces(report), rel=1e-5)
    if method == "magnitude":
        pruned = copy.deepcopy(model)
        prune_model(pruned, method, 0.6)
        assert scored[0.6] == pytest.approx(math.exp(mean_nll(pruned, EVALUATION)), rel=1e-5)


@pytest.mark.parametrize("method", ["slicegpt", "wanda"])
def test_the_model_comes_back_as_it_was(method: str) -> None:
    model = build("llama")
    blocks = list(match_structure(model).blocks(model))
    before = {name: p.detach().clone() for name, p in model.state_dict().items()}
    dense = logits(model, EVALUATION)
    report = _kept(model, method, [0.5])
    with report.models[0].applied(model):
        assert not torch.allclose(logits(model, EVALUATION), dense)
    assert list(match_structure(model).blocks(model)) == blocks
    for name, parameter in model.state_dict().items():
        assert torch.equal(parameter, before[name]), name


@pytest.mark.parametrize("method", ["slicegpt", "wanda"])
def test_an_offloaded_whole_model_streams_and_scores_as_resident(method: str) -> None:
    resident_model = build("llama")
    resident = _whole_model_ppl(resident_model, _kept(resident_model, method, [0.4]))
    model = build("llama")
    streaming = offload(model, match_structure(model).blocks(model), torch.device("cpu"))
    report = _kept(model, method, [0.4])
    simulated = report.models[0]
    with simulated.applied(model):
        active = offloaded(model)
        assert active is not None and active is not streaming  # resumed on what is in place
        scored = math.exp(mean_nll(model, EVALUATION))
        assert active.peak_on_device == 1  # one block on the device at a time
    assert scored == pytest.approx(resident[0.4], rel=1e-6)
    assert offloaded(model) is not None
    assert list(offloaded(model).blocks) == list(match_structure(model).blocks(model))  # type: ignore[union-attr]


def test_bases_that_do_not_match_the_blocks_are_refused() -> None:
    model = build("llama")
    blocks = list(match_structure(model).blocks(model))
    report = _kept(model, "slicegpt", [0.25])
    projected = report.models[0]
    assert isinstance(projected, ProjectedModel)
    short = ProjectedModel(projected.sparsity, projected.adapter, projected.width, projected.bases[:-1])
    with pytest.raises(ValueError, match="signal bases"), short.applied(model):
        pass
    assert list(match_structure(model).blocks(model)) == blocks  # nothing swapped
