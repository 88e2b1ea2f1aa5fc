"""A simulated curve refined to a precision: with a reference point, that point is scored on every
window (its full-window value) and the others are paired with its windows, recomputably."""

from __future__ import annotations

from typing import Any, cast

import pytest
import torch

from core.prediction.paired_windows import DENSE_PAIRING, estimate, window_order
from tests.workers.slicing.tiny import build, token_ids
from workers.context import JobContext
from workers.evaluation.perplexity import window_nll_sums
from workers.kinds import simulate_windows
from workers.kinds.simulate_windows import by_index, pilot_windows, reference_label, refine_points
from workers.simulation import SIMULATED, SimulationOptions, simulate_curve

WINDOWS = 12
SEQLEN = 24
SPARSITIES = [0.2, 0.35, 0.5]
CALIBRATION = token_ids(8, SEQLEN, seed=1)


class _Context:
    """What refine_points asks of a job: whether to stop, and where to report progress."""

    def __init__(self) -> None:
        self.reports: list[str] = []

    def should_stop(self) -> bool:
        return False

    def report(self, stage: str, fraction: float, detail: str) -> None:
        self.reports.append(detail)


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """Tiny models: one torch thread (tests/workers/conftest.py)."""


@pytest.mark.parametrize("reference", [0.35, None])
def test_points_paired_with_a_reference_rest_on_its_every_window(
    monkeypatch: pytest.MonkeyPatch, reference: float | None
) -> None:
    model = build("llama")
    windows = token_ids(WINDOWS, SEQLEN, seed=3)
    order = window_order(WINDOWS, 42)
    pilot = pilot_windows(order, 4)
    options = SimulationOptions(calibration_batch_size=4, keep_models=True)
    report = simulate_curve(
        model,
        "slicegpt",
        windows[torch.tensor(pilot)],
        SPARSITIES,
        calibration_ids=CALIBRATION,
        options=options,
    )
    every = simulate_curve(
        model, "slicegpt", windows, SPARSITIES, calibration_ids=CALIBRATION, options=options
    )
    truth = {p.sparsity: list(p.scores.per_window) for p in every.points if p.role == SIMULATED}
    dense = [float(s) / (SEQLEN - 1) for s in window_nll_sums(model, windows)]
    asked: list[Any] = []

    def choose(pilots: Any, dense_pilot: Any, population: int, precision: float) -> float | None:
        asked.append((dict(pilots), list(dense_pilot), population, precision))
        return reference

    monkeypatch.setattr(simulate_windows, "choose_reference", choose)
    context = _Context()
    found = refine_points(
        cast(JobContext, context),
        model,
        report,
        windows,
        order,
        dense,
        0.5,
        batch_size=2,
        start=0.0,
        end=1.0,
    )
    (pilots, dense_pilot, population, precision) = asked[0]
    assert sorted(pilots) == SPARSITIES and dense_pilot == [dense[i] for i in pilot]
    assert population == WINDOWS and precision == 0.5
    covariate = dense if reference is None else by_index(found[(reference, SIMULATED)])
    for sparsity in SPARSITIES:
        point = found[(sparsity, SIMULATED)]
        assert list(point.indices) == order[: point.windows]
        assert point.window_nll == pytest.approx([truth[sparsity][i] for i in point.indices], rel=1e-5)
        if sparsity == reference:
            assert point.complete and point.nll_mean == pytest.approx(
                sum(truth[sparsity]) / WINDOWS, rel=1e-6
            )
            continue
        assert not point.complete  # a loose precision: the pairing, not every window, gives the value
        assert point.paired_with == (DENSE_PAIRING if reference is None else reference_label(reference))
        again = estimate(point.indices, point.window_nll, WINDOWS, covariate, paired_with=point.paired_with)
        assert point.nll_mean == again.nll_mean and point.half_log == again.half_log
    if reference is not None:
        assert any("every window, the reference" in detail for detail in context.reports)
