"""Mask selection: exact counts per row and per N:M group, lowest scores first."""

from __future__ import annotations

import pytest
import torch

from workers.pruning.masks import n_m_mask, parse_pattern, select_mask, unstructured_mask


@pytest.mark.parametrize(("n", "m"), [(2, 4), (4, 8)])
def test_n_m_mask_zeroes_exactly_n_lowest_in_every_group(n: int, m: int) -> None:
    scores = torch.rand(16, 64, generator=torch.Generator().manual_seed(0))
    mask = n_m_mask(scores, n, m)
    groups = mask.reshape(16, 64 // m, m)
    assert bool((groups.sum(-1) == n).all())
    score_groups = scores.reshape(16, 64 // m, m)
    pruned_max = score_groups.masked_fill(~groups, -1.0).amax(-1)
    kept_min = score_groups.masked_fill(groups, 2.0).amin(-1)
    assert bool((pruned_max < kept_min).all())


def test_unstructured_mask_prunes_floor_of_sparsity_per_row_lowest_first() -> None:
    scores = torch.rand(8, 10, generator=torch.Generator().manual_seed(1))
    mask = unstructured_mask(scores, 0.3)  # 0.3 * 10 is 2.9999... in floats: still 3
    assert mask.sum(1).tolist() == [3] * 8
    assert bool((scores.masked_fill(~mask, -1).amax(1) < scores.masked_fill(mask, 2).amin(1)).all())
    assert unstructured_mask(scores, 0.25).sum(1).tolist() == [2] * 8  # floor(2.5)
    assert not unstructured_mask(scores, 0.0).any()


def test_n_m_mask_needs_a_width_divisible_by_m() -> None:
    with pytest.raises(ValueError, match=r"multiple of 8.*unstructured"):
        select_mask(torch.rand(4, 12), 0.5, "4:8")


def test_unknown_pattern_names_the_choices() -> None:
    with pytest.raises(ValueError, match="unstructured, 2:4, 4:8"):
        parse_pattern("1:4")
