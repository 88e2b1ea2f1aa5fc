"""Calibration streams in a cheaper dtype: the bases change by that dtype's rounding, the model and the
evaluation windows stay in the model's own."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from tests.workers.slicing.tiny import FAMILY_CASES, build, mean_nll, token_ids
from workers.simulation import (
    ANCHOR,
    SIMULATED,
    SimulationOptions,
    SimulationReport,
    projection,
    simulate_curve,
)
from workers.simulation.streams_dtype import computes_bfloat16_natively, resolve_streams_dtype
from workers.slicing.engine import slice_model

CALIBRATION = token_ids(8, 24, seed=1)
EVALUATION = token_ids(3, 24, seed=2)


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """Tiny models: one torch thread (tests/workers/conftest.py)."""


def _curve(model: torch.nn.Module, role: str = SIMULATED, **kwargs: object) -> dict[float, float]:
    anchors = kwargs.pop("anchors", ())
    options = SimulationOptions(calibration_batch_size=3, eval_batch_size=2, **kwargs)  # type: ignore[arg-type]
    report: SimulationReport = simulate_curve(
        model,
        "slicegpt",
        EVALUATION,
        [0.25, 0.5],
        anchors=anchors,  # type: ignore[arg-type]
        calibration_ids=CALIBRATION,
        options=options,
    )
    return {p.sparsity: p.scores.ppl for p in report.points if p.role == role}


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_bfloat16_streams_move_the_curve_by_rounding_only(case: str) -> None:
    model = build(case)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    exact = _curve(model)
    cheap = _curve(model, streams_dtype=torch.bfloat16)
    for sparsity, value in exact.items():
        assert cheap[sparsity] == pytest.approx(value, rel=2e-2)
    assert cheap != exact  # the streams really ran in bfloat16: their bases differ by its rounding
    for name, tensor in model.state_dict().items():
        assert tensor.dtype == torch.float32 and torch.equal(tensor, before[name])


def test_streams_in_the_models_own_dtype_are_the_default_bit_for_bit() -> None:
    model = build("llama")
    assert _curve(model, streams_dtype=torch.float32) == _curve(model)


def test_bfloat16_streams_take_their_moment_products_in_float64(monkeypatch: pytest.MonkeyPatch) -> None:
    """float32 products, fine for one signal (4e-8 of an entry), moved SmolLM2's curve 1-1.5 % through
    30 blocks of sequential streams (bench/README.md, `moment_products.py`): the streams keep float64."""
    made: list[torch.dtype] = []

    class Recorded(projection.SecondMoment):
        def __init__(self, width: int, device: torch.device, products: torch.dtype = torch.float64) -> None:
            made.append(products)
            super().__init__(width, device, products)

    monkeypatch.setattr(projection, "SecondMoment", Recorded)
    _curve(build("llama"), streams_dtype=torch.bfloat16)
    assert made and set(made) == {torch.float64}


@pytest.mark.parametrize("case", ["llama", "gemma3"])
def test_an_anchor_keeps_the_models_dtype_beside_bfloat16_streams(case: str) -> None:
    """An anchor is the method itself: its stream runs in float32 whatever the others run in."""
    model = build(case)
    anchor = _curve(model, ANCHOR, anchors=[0.25], streams_dtype=torch.bfloat16)[0.25]
    sliced = copy.deepcopy(model)
    slice_model(sliced, CALIBRATION, None, 0.25, batch_size=3)
    assert anchor == pytest.approx(math.exp(mean_nll(sliced, EVALUATION)), rel=1e-4)


def test_the_streams_dtype_is_what_the_job_asks_else_bfloat16_only_where_native() -> None:
    cpu = torch.device("cpu")
    native = computes_bfloat16_natively(cpu)
    assert resolve_streams_dtype(None, torch.float32, cpu) == (torch.bfloat16 if native else None)
    assert resolve_streams_dtype(None, torch.bfloat16, cpu) is None  # already the cheap dtype
    assert resolve_streams_dtype("float32", torch.float32, cpu) is None  # the model's own: no copy
    assert resolve_streams_dtype("bfloat16", torch.float32, cpu) == torch.bfloat16
    assert resolve_streams_dtype("float32", torch.bfloat16, cpu) == torch.float32
