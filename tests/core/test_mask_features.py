"""The mask-error features a profile offers the intra-layer methods: interpolation in s and the
aggregates over linears."""

from __future__ import annotations

import pytest

from core.methods import METHODS
from core.profiles import METHOD_FEATURES, LinearErrors, mask_feature_value

SPARSITIES = (0.2, 0.4)


def _linear(layer: int, name: str, energy: float, errors: tuple[float, float]) -> LinearErrors:
    return LinearErrors(layer, name, energy, {"wanda": errors}, SPARSITIES)


LINEARS = [
    _linear(0, "q", 1.0, (0.1, 0.3)),
    _linear(0, "down", 3.0, (0.2, 0.5)),
    _linear(1, "q", 1.0, (0.05, 0.2)),
    _linear(1, "down", 3.0, (0.1, 0.4)),
]


def test_errors_are_exact_at_profiled_sparsities_linear_between_and_zero_at_zero() -> None:
    linear = LINEARS[0]
    assert linear.error("wanda", 0.2) == 0.1 and linear.error("wanda", 0.0) == 0.0
    assert linear.error("wanda", 0.3) == pytest.approx(0.2)
    assert linear.error("wanda", 0.1) == pytest.approx(0.05)
    with pytest.raises(ValueError, match="outside the profiled sparsities"):
        linear.error("wanda", 0.5)
    with pytest.raises(ValueError, match="no 'magnitude' mask errors"):
        linear.error("magnitude", 0.2)


def test_aggregates() -> None:
    at = 0.4
    errors = [0.3, 0.5, 0.2, 0.4]
    assert mask_feature_value("output-error-mean", LINEARS, "wanda", at) == pytest.approx(sum(errors) / 4)
    assert mask_feature_value("output-error-depth-sum", LINEARS, "wanda", at) == pytest.approx(
        sum(errors) / 2
    )
    weighted = (0.3 + 3 * 0.5 + 0.2 + 3 * 0.4) / 8
    assert mask_feature_value("output-error-weighted", LINEARS, "wanda", at) == pytest.approx(weighted)
    assert mask_feature_value("output-error-max", LINEARS, "wanda", at) == 0.5


def test_every_profiled_method_is_a_stored_method_with_a_rule_or_slicings_spectra() -> None:
    for method, entry in METHOD_FEATURES.items():
        assert method in METHODS
        assert (entry.rule is None) == (method == "slicegpt")
        assert entry.names and all(entry.description(name) for name in entry.names)
