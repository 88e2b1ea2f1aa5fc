"""Further windows on a cheaper copy: each window corrected by the dense model's own gap in that dtype,
the pilot and the job's model untouched, the model's own dtype the same numbers as no copy at all."""

from __future__ import annotations

import copy
from typing import Any, cast

import pytest
import torch

from core.prediction.paired_windows import window_order
from tests.workers.simulation.test_curve_refinement import CALIBRATION, SEQLEN, SPARSITIES, WINDOWS, _Context
from tests.workers.slicing.tiny import build, token_ids
from workers.context import JobContext
from workers.evaluation.perplexity import window_nll_sums
from workers.kinds.simulate_windows import pilot_windows, refine_points
from workers.offload import offload
from workers.pruning.linears import linear_weights
from workers.simulation import SIMULATED, SimulationOptions, SimulationReport, simulate_curve
from workers.simulation.cheap_windows import CheapWindows, resolve_window_dtype
from workers.simulation.streams_dtype import computes_bfloat16_natively
from workers.simulation.whole_models import MaskedModel, ProjectedModel

WINDOW_IDS = token_ids(WINDOWS, SEQLEN, seed=3)


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """Tiny models: one torch thread (tests/workers/conftest.py)."""


def _window_nll(model: torch.nn.Module, windows: torch.Tensor) -> list[float]:
    return [float(s) / (windows.shape[1] - 1) for s in window_nll_sums(model, windows)]


def _simulated(model: torch.nn.Module, windows: torch.Tensor) -> SimulationReport:
    options = SimulationOptions(calibration_batch_size=4, keep_models=True)
    return simulate_curve(
        model, "slicegpt", windows, SPARSITIES, calibration_ids=CALIBRATION, options=options
    )


def _projected(report: SimulationReport, sparsity: float) -> ProjectedModel:
    found = next(m for m in report.models if m.sparsity == sparsity)
    assert isinstance(found, ProjectedModel)
    return found


@pytest.mark.parametrize("case", ["llama", "gemma3"])
def test_each_window_is_the_cheap_value_less_the_dense_models_own_gap(case: str) -> None:
    model = build(case)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    dense = _window_nll(model, WINDOW_IDS)
    simulated = _projected(_simulated(model, WINDOW_IDS[:2]), 0.35)
    cheap = CheapWindows(model, torch.bfloat16, WINDOW_IDS, dense)
    indices = [5, 0, 7]
    corrected = cheap.scorer(simulated)(indices)

    copy_bf16 = build(case).to(torch.bfloat16)  # the same seeded weights, cast apart from the job's
    dense_bf16 = _window_nll(copy_bf16, WINDOW_IDS)
    with simulated.applied(copy_bf16):
        simulated_bf16 = _window_nll(copy_bf16, WINDOW_IDS)
    with simulated.applied(model):
        simulated_fp32 = _window_nll(model, WINDOW_IDS)
    for value, index in zip(corrected, indices, strict=True):
        expected = simulated_bf16[index] - (dense_bf16[index] - dense[index])
        assert value == pytest.approx(expected, abs=1e-6)
        assert value == pytest.approx(simulated_fp32[index], rel=2e-2)  # bfloat16's rounding, no more
    assert corrected != [simulated_fp32[i] for i in indices]  # it really ran in bfloat16
    for name, tensor in model.state_dict().items():  # the job's model is neither cast nor changed
        assert tensor.dtype == torch.float32 and torch.equal(tensor, before[name])


def test_the_dense_gap_follows_the_stored_baseline_and_is_scored_once_per_window() -> None:
    model = build("llama")
    dense = _window_nll(model, WINDOW_IDS)
    simulated = _projected(_simulated(model, WINDOW_IDS[:2]), 0.5)
    shifted = [value + 1.0 for value in dense]  # a baseline one nat higher per window
    plain = CheapWindows(model, torch.bfloat16, WINDOW_IDS, dense).scorer(simulated)([1, 2])
    cheap = CheapWindows(model, torch.bfloat16, WINDOW_IDS, shifted)
    moved = cheap.scorer(simulated)([1, 2])
    assert moved == pytest.approx([value + 1.0 for value in plain], abs=1e-9)
    cheap.scorer(simulated)([2, 3])
    assert cheap.dense_windows == 3 and cheap.windows_scored == 4
    assert 0.0 < cheap.dense_seconds < cheap.seconds
    with pytest.raises(ValueError, match="dense window values"):
        CheapWindows(model, torch.bfloat16, WINDOW_IDS, dense[:-1])


def test_dense_values_known_from_an_earlier_job_are_used_and_not_scored_again() -> None:
    """What one job scored on the dense copy (`dense_scored`), handed to the next as `known`, gives
    the same corrected windows without scoring the dense copy on them; a wrong known value moves
    exactly its own window."""
    model = build("llama")
    dense = _window_nll(model, WINDOW_IDS)
    simulated = _projected(_simulated(model, WINDOW_IDS[:2]), 0.5)
    first = CheapWindows(model, torch.bfloat16, WINDOW_IDS, dense)
    values = first.scorer(simulated)([1, 2, 3])
    assert sorted(first.dense_scored) == [1, 2, 3] and first.dense_reused == 0
    second = CheapWindows(model, torch.bfloat16, WINDOW_IDS, dense, known=first.dense_scored)
    assert second.scorer(simulated)([1, 2, 3]) == values
    assert second.dense_windows == 0 and second.dense_reused == 3
    off = {**first.dense_scored, 2: first.dense_scored[2] + 0.5}
    third = CheapWindows(model, torch.bfloat16, WINDOW_IDS, dense, known=off)
    assert third.scorer(simulated)([1, 2, 3]) == pytest.approx(
        [values[0], values[1] - 0.5, values[2]], abs=1e-12
    )
    fourth = CheapWindows(model, torch.bfloat16, WINDOW_IDS, dense, known={1: first.dense_scored[1]})
    assert fourth.scorer(simulated)([1, 2, 3]) == values
    assert sorted(fourth.dense_scored) == [2, 3] and fourth.dense_reused == 1


def _refined(
    model: torch.nn.Module, cheap: CheapWindows | None, *, pilot_in_pass: bool = True
) -> tuple[dict[Any, Any], SimulationReport]:
    """A curve to 0.05 with a 4-window pilot, scored by the pass or (not `pilot_in_pass`) after it."""
    order = window_order(WINDOWS, 42)
    pilot = pilot_windows(order, 4) if pilot_in_pass else []
    report = _simulated(model, WINDOW_IDS[torch.tensor(pilot, dtype=torch.long)])
    dense = _window_nll(model, WINDOW_IDS)
    found = refine_points(
        cast(JobContext, _Context()),
        model,
        report,
        WINDOW_IDS,
        order,
        dense,
        0.05,
        batch_size=2,
        start=0.0,
        end=1.0,
        cheap=cheap,
        pilot_size=None if pilot_in_pass else 4,
    )
    return found, report


def test_a_copy_in_the_models_own_dtype_gives_the_curve_without_one() -> None:
    model = build("llama")
    dense = _window_nll(model, WINDOW_IDS)
    plain, _ = _refined(model, None)
    copied, _ = _refined(model, CheapWindows(model, torch.float32, WINDOW_IDS, dense))
    assert plain.keys() == copied.keys()
    for key, found in plain.items():
        assert copied[key].indices == found.indices
        assert copied[key].window_nll == pytest.approx(found.window_nll, abs=1e-9)


def test_the_pilot_stays_in_the_models_dtype_and_only_further_windows_run_cheap() -> None:
    model = build("llama")
    dense = _window_nll(model, WINDOW_IDS)
    cheap = CheapWindows(model, torch.bfloat16, WINDOW_IDS, dense)
    found, report = _refined(model, cheap)
    further = 0
    for point in report.points:
        refined = found[(point.sparsity, SIMULATED)]
        pilot = point.scores.per_window
        assert list(refined.window_nll[: len(pilot)]) == pilot  # bit for bit: not rescored
        further += refined.windows - len(pilot)
    assert further > 0 and cheap.windows_scored == further


def test_a_pilot_the_pass_did_not_score_is_each_face_values_own_whole_model_on_those_windows() -> None:
    """The same curve whether the pass or each face value's whole model scores the pilot (the same
    arithmetic); on a copy, the pilot is its corrected windows like the rest."""
    model = build("llama")
    in_pass, _ = _refined(model, None)
    off_pass, report = _refined(model, None, pilot_in_pass=False)
    assert all(not point.scores.per_window for point in report.points)  # the pass scored no window
    assert off_pass.keys() == in_pass.keys()
    for key, found in in_pass.items():
        assert off_pass[key].indices == found.indices
        assert off_pass[key].window_nll == pytest.approx(found.window_nll, abs=1e-5)
    dense = _window_nll(model, WINDOW_IDS)
    cheap = CheapWindows(model, torch.bfloat16, WINDOW_IDS, dense)
    on_copy, _ = _refined(model, cheap, pilot_in_pass=False)
    assert cheap.windows_scored == sum(found.windows for found in on_copy.values())  # the pilot too
    pilot = on_copy[(0.35, SIMULATED)].indices[:4]
    alone = CheapWindows(model, torch.bfloat16, WINDOW_IDS, dense)
    simulated = _projected(report, 0.35)
    assert list(on_copy[(0.35, SIMULATED)].window_nll[:4]) == alone.scorer(simulated)(pilot)


def test_the_window_dtype_is_what_the_job_asks_else_bfloat16_where_native_and_resident() -> None:
    cpu = torch.device("cpu")
    model = build("llama")
    native = computes_bfloat16_natively(cpu)
    assert resolve_window_dtype(None, model, cpu) == (torch.bfloat16 if native else None)
    assert resolve_window_dtype("float32", model, cpu) is None  # the model's own: no copy
    assert resolve_window_dtype("bfloat16", model, cpu) == torch.bfloat16
    assert resolve_window_dtype(None, build("llama").to(torch.bfloat16), cpu) is None
    offload(model, model.model.layers, cpu)  # no room for a copy of a model that streams its blocks
    assert resolve_window_dtype(None, model, cpu) is None
    assert resolve_window_dtype("bfloat16", model, cpu) is None  # asked for, but no room: the model's own


def _masked(model: torch.nn.Module, method: str) -> MaskedModel:
    options = SimulationOptions(calibration_batch_size=4, keep_models=True)
    calibration = None if method == "magnitude" else CALIBRATION
    windows = WINDOW_IDS[:2]
    report = simulate_curve(model, method, windows, [0.5], calibration_ids=calibration, options=options)
    (found,) = report.models
    assert isinstance(found, MaskedModel)
    return found


@pytest.mark.parametrize(("case", "method"), [("llama", "magnitude"), ("gemma3", "wanda")])
def test_a_mask_points_copy_holds_its_float32_masks_cast_and_each_window_is_corrected(
    case: str, method: str
) -> None:
    """The masks are picked on the float32 weights; the copy scores with them cast, each window less
    the dense gap; between points (and while the dense copy scores a window) the copy is the dense
    model cast again, and the job's model is never changed."""
    model = build(case)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    dense = _window_nll(model, WINDOW_IDS)
    masked = _masked(model, method)
    cheap = CheapWindows(model, torch.bfloat16, WINDOW_IDS, dense)
    with cheap.masked_scorer(masked) as score:
        corrected = score([5, 0]) + score([7])  # window 7's dense value is scored between the two

    pruned = build(case)
    with masked.applied(pruned):
        pruned_bf16 = copy.deepcopy(pruned).to(torch.bfloat16)
    zeros = [weight == 0 for weight in linear_weights(masked.adapter, pruned_bf16)]
    assert all(bool(zero.any()) for zero in zeros)
    masked_bf16 = _window_nll(pruned_bf16, WINDOW_IDS)
    dense_copy = build(case).to(torch.bfloat16)
    dense_bf16 = _window_nll(dense_copy, WINDOW_IDS)
    for value, index in zip(corrected, [5, 0, 7], strict=True):
        assert value == pytest.approx(masked_bf16[index] - (dense_bf16[index] - dense[index]), abs=1e-6)
    assert cheap.dense_windows == 3 and cheap.windows_scored == 3
    for name, tensor in cheap.model.state_dict().items():  # the dense copy again, bit for bit
        assert torch.equal(tensor, dense_copy.state_dict()[name])
    for name, tensor in model.state_dict().items():
        assert tensor.dtype == torch.float32 and torch.equal(tensor, before[name])
