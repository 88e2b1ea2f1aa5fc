"""The regression estimator of a sequential stream's every-window moment (`basis_regression`)."""

from __future__ import annotations

import pytest
import torch

from tests.workers.slicing.tiny import build, token_ids
from workers.block_inputs import BlockBatch
from workers.simulation import SIMULATED, SimulationOptions, simulate_curve
from workers.simulation.basis_regression import (
    CrossMoment,
    DenseReference,
    measure_reference,
    regressed_moment,
)
from workers.simulation.whole_models import ProjectedModel
from workers.slicing.pca import SecondMoment

WIDTH = 6


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """Tiny models: one torch thread (tests/workers/conftest.py)."""


def _batches(signals: list[torch.Tensor]) -> list[BlockBatch]:
    return [BlockBatch(hidden=s, keep=torch.ones(s.shape[:2], dtype=torch.bool), calls=[]) for s in signals]


def _estimate(dense: list[torch.Tensor], projected: list[torch.Tensor]) -> torch.Tensor:
    """Ĉ for a reference over `dense` whose first len(projected) batches the subset stream holds."""
    reference = DenseReference(_batches(dense), subset=len(projected))
    measure_reference(reference, dense, WIDTH, torch.device("cpu"))
    moment = SecondMoment(WIDTH, torch.device("cpu"))
    cross = CrossMoment(WIDTH, torch.device("cpu"))
    for p, x in zip(projected, dense, strict=False):
        keep = torch.ones(p.shape[:2], dtype=torch.bool)
        moment.add(p, keep)
        cross.add(p, x, keep)
    return regressed_moment(moment.matrix, moment.positions, cross, reference)


def _signals(count: int, seed: int, scale: torch.Tensor | None = None) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    made = [torch.randn(2, 40, WIDTH, generator=generator, dtype=torch.float64) for _ in range(count)]
    return made if scale is None else [m * scale for m in made]


def _moment(signals: list[torch.Tensor]) -> torch.Tensor:
    rows = torch.cat([s.reshape(-1, WIDTH) for s in signals])
    return rows.T @ rows / rows.shape[0]


def test_every_window_in_the_subset_gives_the_plain_moment() -> None:
    dense = _signals(3, seed=0)
    projected = [x * 0.5 + 0.1 for x in dense]
    plain = SecondMoment(WIDTH, torch.device("cpu"))
    for p in projected:
        plain.add(p, torch.ones(p.shape[:2], dtype=torch.bool))
    assert torch.equal(_estimate(dense, projected), plain.matrix / plain.positions)


def test_a_projected_stream_linear_in_the_dense_one_gets_every_windows_moment() -> None:
    """p = x A on every position: the regression recovers A, so Ĉ is Aᵀ C_all A, what the stream would
    have had over every window, though it ran over a third of them (and the subset's own moment is not)."""
    dense = _signals(6, seed=1)
    dense[0] = dense[0] * 3.0  # the subset differs from the rest
    linear = torch.randn(WIDTH, WIDTH, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    projected = [x @ linear for x in dense]
    truth = linear.T @ _moment(dense) @ linear
    estimate = _estimate(dense, projected[:2])
    assert torch.allclose(estimate, truth, rtol=1e-4, atol=1e-5 * float(truth.diagonal().mean()))
    assert not torch.allclose(_moment(projected[:2]), truth, rtol=0.05)


def test_the_estimate_is_positive_semidefinite_where_the_plain_difference_is_not() -> None:
    """A direction large on the subset and dropped by the projection there (the massive-activation case
    that broke C_pp,sub + C_all - C_sub): the difference goes negative, the regression does not."""
    scale = torch.ones(WIDTH, dtype=torch.float64)
    scale[0] = 30.0
    dense = _signals(2, seed=3, scale=scale) + _signals(4, seed=4)
    kill = torch.ones(WIDTH, dtype=torch.float64)
    kill[0] = 0.01
    projected = [x * kill for x in dense[:2]]
    c_sub = _moment(dense[:2])
    difference = _moment(projected) + _moment(dense) - c_sub
    assert float(torch.linalg.eigvalsh(difference)[0]) < 0
    estimate = _estimate(dense, projected)
    assert float(torch.linalg.eigvalsh(estimate)[0]) >= -1e-9 * float(estimate.diagonal().mean())


def _kept_projectors(report_options: SimulationOptions) -> list[torch.Tensor]:
    model = build("llama")
    report = simulate_curve(
        model,
        "slicegpt",
        token_ids(2, 24, seed=2),
        [0.25],
        calibration_ids=token_ids(8, 48, seed=1),  # a subset of 2 windows: 96 positions, more than D = 64
        options=report_options,
    )
    [simulated] = [m for m in report.models if isinstance(m, ProjectedModel)]
    width = report.points[0].width
    return [b[:, :width].double() @ b[:, :width].double().T for b in simulated.bases if b is not None]


def test_the_first_basis_of_a_corrected_stream_is_every_windows() -> None:
    """At the embedding output the stream is still the dense one (nothing projected yet), so M = I and
    the corrected basis is the one every window gives; the subset's own is not. Later bases may differ."""
    common = dict(calibration_batch_size=2, eval_batch_size=2, keep_models=True, round_to=1)
    every = _kept_projectors(SimulationOptions(**common))  # type: ignore[arg-type]
    subset = _kept_projectors(SimulationOptions(basis_windows=2, **common))  # type: ignore[arg-type]
    corrected = _kept_projectors(
        SimulationOptions(basis_windows=2, basis_estimator="regression", **common)  # type: ignore[arg-type]
    )
    assert torch.allclose(corrected[0], every[0], atol=1e-4)
    assert not torch.allclose(subset[0], every[0], atol=1e-2)
    assert not torch.allclose(corrected[-1], every[-1], atol=1e-6)


def test_with_every_window_the_regression_estimator_is_the_plain_one() -> None:
    common = dict(calibration_batch_size=3, eval_batch_size=2, basis_windows=8)
    model = build("llama")
    reports = [
        simulate_curve(
            model,
            "slicegpt",
            token_ids(3, 24, seed=2),
            [0.2, 0.4],
            calibration_ids=token_ids(8, 24, seed=1),
            options=SimulationOptions(basis_estimator=estimator, **common),  # type: ignore[arg-type]
        )
        for estimator in ("subset", "regression")
    ]
    values = [[p.scores.ppl for p in r.points if p.role == SIMULATED] for r in reports]
    assert values[0] == values[1]
    assert reports[1].basis_estimator is None
