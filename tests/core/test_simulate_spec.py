"""How many calibration windows a simulated sparsity's sequential bases are taken from."""

from __future__ import annotations

from core.specs.simulate import MIN_BASIS_WINDOWS, SimulateJobCreate


def _spec(num_sequences: int, **overrides: object) -> SimulateJobCreate:
    body = {
        "kind": "simulate",
        "model": "m",
        "method": "slicegpt",
        "sparsities": [0.25],
        "calibration": {"num_sequences": num_sequences, "seqlen": 32},
        **overrides,
    }
    return SimulateJobCreate.model_validate(body)


def test_bfloat16_streams_take_every_window_and_float32_ones_three_quarters() -> None:
    spec = _spec(32)
    assert spec.sequential_windows(streams_in_bfloat16=True) == 32
    assert spec.sequential_windows(streams_in_bfloat16=False) == 24
    assert _spec(12).sequential_windows(streams_in_bfloat16=False) == 9
    # a small calibration keeps at least MIN_BASIS_WINDOWS, never more than it has
    assert _spec(10).sequential_windows(streams_in_bfloat16=False) == MIN_BASIS_WINDOWS
    assert _spec(4).sequential_windows(streams_in_bfloat16=False) == 4


def test_windows_the_job_names_win_over_either_default() -> None:
    spec = _spec(32, basis_windows=10)
    assert spec.sequential_windows(streams_in_bfloat16=True) == 10
    assert spec.sequential_windows(streams_in_bfloat16=False) == 10
