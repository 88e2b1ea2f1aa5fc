"""Step 5 of SliceGPT: the PCA of a residual signal ignores padded positions."""

from __future__ import annotations

import pytest
import torch

from workers.slicing import pca
from workers.slicing.pca import DAMPING, SecondMoment, principal_basis


def _signal(batch: int, length: int, width: int, seed: int) -> torch.Tensor:
    return torch.randn(batch, length, width, generator=torch.Generator().manual_seed(seed))


def test_padded_positions_do_not_change_the_second_moment_or_basis() -> None:
    signal = _signal(3, 10, 16, seed=0)
    keep = torch.ones(3, 10, dtype=torch.bool)
    plain = SecondMoment(16, torch.device("cpu"))
    plain.add(signal, keep)

    # The same signal with extra padded positions (holding garbage, even nan) and an extra padded row.
    garbage = torch.full((3, 4, 16), float("nan"))
    padded_signal = torch.cat([signal, garbage], dim=1)
    padded_keep = torch.cat([keep, torch.zeros(3, 4, dtype=torch.bool)], dim=1)
    padded = SecondMoment(16, torch.device("cpu"))
    padded.add(padded_signal, padded_keep)
    padded.add(_signal(2, 14, 16, seed=1), torch.zeros(2, 14, dtype=torch.bool))

    torch.testing.assert_close(padded.matrix, plain.matrix, rtol=1e-12, atol=1e-12)
    assert padded.positions == plain.positions == 30
    plain_values, plain_basis = principal_basis(plain.matrix)
    padded_values, padded_basis = principal_basis(padded.matrix)
    torch.testing.assert_close(padded_values, plain_values)
    # eigenvectors are defined up to sign
    torch.testing.assert_close(
        (padded_basis.T @ plain_basis).abs(), torch.eye(16, dtype=torch.float64), atol=1e-8, rtol=0
    )


def test_principal_basis_is_orthogonal_sorted_descending_and_damped() -> None:
    signal = _signal(2, 50, 8, seed=2) * torch.linspace(0.1, 3.0, 8)
    moment = SecondMoment(8, torch.device("cpu"))
    moment.add(signal, torch.ones(2, 50, dtype=torch.bool))

    values, basis = principal_basis(moment.matrix)

    assert basis.dtype == torch.float64
    assert torch.all(values[:-1] >= values[1:])
    torch.testing.assert_close(basis.T @ basis, torch.eye(8, dtype=torch.float64))
    damped = moment.matrix + DAMPING * moment.matrix.diagonal().mean() * torch.eye(8, dtype=torch.float64)
    torch.testing.assert_close(basis @ torch.diag(values) @ basis.T, damped)


def test_second_moment_is_not_centred() -> None:
    signal = torch.ones(1, 4, 3)  # constant signal: zero variance, nonzero second moment
    moment = SecondMoment(3, torch.device("cpu"))
    moment.add(signal, torch.ones(1, 4, dtype=torch.bool))

    torch.testing.assert_close(moment.matrix, torch.full((3, 3), 4.0, dtype=torch.float64))


def test_second_moment_from_lower_blocks_and_row_chunks_equals_the_full_product(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only C's lower column blocks are accumulated, on chunks of rows; `matrix` must still be the
    whole float64 X^T X (a width that the blocks do not divide, several chunks, padding)."""
    monkeypatch.setattr(pca, "MOMENT_ROWS", 7)
    signal = _signal(3, 10, 10, seed=3)
    keep = torch.rand(3, 10, generator=torch.Generator().manual_seed(4)) > 0.2
    moment = SecondMoment(10, torch.device("cpu"))
    moment.add(signal, keep)
    moment.add(signal[:1], keep[:1])

    rows = torch.cat([signal[keep], signal[:1][keep[:1]]]).double()  # (positions, D)
    torch.testing.assert_close(moment.matrix, rows.T @ rows, rtol=1e-12, atol=1e-12)
    assert moment.positions == rows.shape[0]


@pytest.mark.parametrize("unit_rows", [False, True])
def test_float32_products_give_the_float64_moment_to_float32_rounding(
    monkeypatch: pytest.MonkeyPatch, unit_rows: bool
) -> None:
    """The profile's float32 products, summed in float64 chunk by chunk: the same C to a few 1e-7,
    with padding masked and rows normalised as in float64."""
    monkeypatch.setattr(pca, "MOMENT_ROWS", 16)
    signal = _signal(4, 40, 12, seed=5) * torch.linspace(0.5, 20.0, 12)  # one dominant direction
    keep = torch.rand(4, 40, generator=torch.Generator().manual_seed(6)) > 0.2
    exact, products = (
        SecondMoment(12, torch.device("cpu")),
        SecondMoment(12, torch.device("cpu"), torch.float32),
    )
    exact.add(signal, keep, unit_rows=unit_rows)
    products.add(signal, keep, unit_rows=unit_rows)
    assert products.matrix.dtype == torch.float64 and products.positions == exact.positions
    torch.testing.assert_close(
        products.matrix, exact.matrix, rtol=1e-6, atol=1e-6 * float(exact.matrix.max())
    )
    assert not torch.equal(products.matrix, exact.matrix)  # the float32 path ran
