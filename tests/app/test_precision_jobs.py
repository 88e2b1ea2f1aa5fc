"""Jobs with a `precision`: a few windows in a seeded order, paired with the dense model's own, and a
band for the full-window value; the same windows a prune of the same seed scores."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient

from core.prediction.paired_windows import estimate, window_order
from tests.app.test_jobs_api import assert_problem
from tests.app.test_prune_jobs import prune_body, wait_done
from tests.app.test_simulate_jobs import simulate_body
from workers.simulation.streams_dtype import computes_bfloat16_natively

WINDOWS = 24
SEQLEN = 64


def _protocol(precision: float | None) -> dict[str, Any]:
    return {"seqlen": SEQLEN, "max_windows": WINDOWS, "precision": precision}


def _ppl_rows(api: TestClient, job_id: str) -> list[dict[str, Any]]:
    rows = api.get("/v1/results", params={"job_id": job_id, "limit": 50}).json()["items"]
    return [row for row in rows if row["metric"] == "ppl"]


def _run(api: TestClient, worker: Any, body: dict[str, Any]) -> list[dict[str, Any]]:
    job = api.post("/v1/jobs", json=body).json()
    wait_done(api, job["id"], worker)
    return _ppl_rows(api, job["id"])


def test_a_simulated_subset_is_the_pruned_models_same_windows_and_its_estimate_is_recomputable(
    api: TestClient, start_worker: Any, tiny_model_dir: Path
) -> None:
    """Magnitude's simulation is exact: on every window both scored, the simulated NLL is the pruned
    model's; the stored value is the paired estimate of the stored windows, recomputed here."""
    worker = start_worker()
    model = str(tiny_model_dir)
    body = simulate_body(model, method="magnitude", sparsities=[0.5], anchors=[], perplexity=_protocol(1e-4))
    simulated = [r for r in _run(api, worker, body) if r["source"] == "simulated"]
    (face,) = simulated
    sampling = face["protocol"]["sampling"]
    dense_rows = api.get("/v1/results", params={"model": model, "method": "dense", "metric": "ppl"}).json()
    dense_windows = dense_rows["items"][0]["protocol"]["window_nll"]
    assert len(dense_windows) == WINDOWS and sampling["of_windows"] == WINDOWS
    indices, values = sampling["window_indices"], face["protocol"]["window_nll"]
    assert indices == window_order(WINDOWS, 42)[: sampling["windows"]] and len(values) == len(indices)
    assert sampling["windows"] > 8  # 1e-4 is out of the pilot's reach: the whole model scored more
    again = estimate(indices, values, WINDOWS, dense_windows, estimator=sampling["estimator"])
    assert math.isclose(face["value"], again.ppl, rel_tol=1e-12)
    assert face["n"] == sampling["windows"] * (SEQLEN - 1)

    pruned = _run(api, worker, prune_body(model, 0.5, method="magnitude", perplexity=_protocol(1e-4)))
    (measured,) = [r for r in pruned if r["method"] != "dense"]
    pruned_by_window = dict(
        zip(
            measured["protocol"]["sampling"]["window_indices"],
            measured["protocol"]["window_nll"],
            strict=True,
        )
    )
    common = [index for index in indices if index in pruned_by_window]
    assert len(common) >= 8
    for index, value in zip(indices, values, strict=True):
        if index in pruned_by_window:
            assert math.isclose(value, pruned_by_window[index], rel_tol=1e-5), index

    full = _run(api, worker, prune_body(model, 0.5, method="magnitude", perplexity=_protocol(None)))
    (truth,) = [r for r in full if r["method"] != "dense"]
    assert "sampling" not in truth["protocol"]
    if sampling["windows"] == WINDOWS:  # every window: the full-window value
        assert math.isclose(face["value"], truth["value"], rel_tol=1e-5)
        assert face["protocol"]["band"] is None
    else:
        band = face["protocol"]["band"]
        assert band["low"] <= truth["value"] <= band["high"]


def test_a_measured_prune_to_a_precision_stores_its_windows_and_a_band_for_the_full_value(
    api: TestClient, start_worker: Any, tiny_model_dir: Path
) -> None:
    worker = start_worker()
    model = str(tiny_model_dir)
    full = _run(api, worker, prune_body(model, 0.4, method="magnitude", perplexity=_protocol(None)))
    sampled = _run(api, worker, prune_body(model, 0.4, method="magnitude", perplexity=_protocol(0.02)))
    (truth,) = [r for r in full if r["method"] != "dense"]
    (row,) = [r for r in sampled if r["method"] != "dense"]
    sampling = row["protocol"]["sampling"]
    assert sampling["precision"] == 0.02 and sampling["estimator"] == "regression"
    assert sampling["reached"] is True and sampling["relative_half_width"] <= 0.02
    assert 8 <= sampling["windows"] < WINDOWS and row["protocol"]["windows"] == sampling["windows"]
    assert row["stderr"] is not None and row["stderr"] > 0
    assert sampling["low"] <= truth["value"] <= sampling["high"]
    # The dense baseline was measured once, on every window, and reused by the second prune.
    dense = [r for r in full + sampled if r["method"] == "dense"]
    assert len(dense) == 1 and len(dense[0]["protocol"]["window_nll"]) == WINDOWS


def test_an_evaluation_to_a_precision_is_unpaired_and_never_reused_as_a_baseline(
    api: TestClient, start_worker: Any, tiny_model_dir: Path
) -> None:
    worker = start_worker()
    model = str(tiny_model_dir)
    body = {"kind": "evaluate", "model": model, "perplexity": _protocol(0.5)}
    (row,) = _run(api, worker, body)
    assert row["protocol"]["sampling"]["estimator"] == "unpaired"
    pruned = _run(api, worker, prune_body(model, 0.3, method="magnitude", perplexity=_protocol(None)))
    dense = [r for r in pruned if r["method"] == "dense"]
    assert len(dense) == 1 and "sampling" not in dense[0]["protocol"]  # measured anew on every window


@pytest.mark.parametrize("precision", [0, 1, -0.5, 1.5, "tight"])
@pytest.mark.parametrize("kind", ["prune", "simulate", "evaluate"])
def test_a_precision_outside_zero_one_is_a_422_naming_the_field(
    api: TestClient, tiny_model_dir: Path, kind: str, precision: Any
) -> None:
    perplexity = {"seqlen": SEQLEN, "precision": precision}
    bodies = {
        "prune": prune_body(str(tiny_model_dir), method="magnitude", perplexity=perplexity),
        "simulate": simulate_body(str(tiny_model_dir), method="magnitude", anchors=[], perplexity=perplexity),
        "evaluate": {"kind": "evaluate", "model": str(tiny_model_dir), "perplexity": perplexity},
    }
    problem = assert_problem(api.post("/v1/jobs", json=bodies[kind]), 422)
    assert "precision" in str(problem)


def test_slicings_further_windows_run_in_bfloat16_where_native_and_say_so(
    api: TestClient, start_worker: Any, tiny_model_dir: Path
) -> None:
    """Past the 8-window pilot, a SliceGPT point's windows run on a bfloat16 copy where this CPU
    computes it natively (gap-corrected per window); the pilot's windows are the float32 ones."""
    worker = start_worker()
    model = str(tiny_model_dir)
    runs = {}
    for asked in (None, "float32"):
        body = simulate_body(
            model, sparsities=[0.5], anchors=[], perplexity=_protocol(1e-4), window_dtype=asked
        )
        runs[asked] = [r for r in _run(api, worker, body) if r["source"] == "simulated"]
    (default,), (plain,) = runs[None], runs["float32"]
    cheap = "bfloat16" if computes_bfloat16_natively(torch.device("cpu")) else "float32"
    assert default["protocol"]["simulation"]["window_dtype"] == cheap
    assert plain["protocol"]["simulation"]["window_dtype"] == "float32"
    assert default["protocol"]["sampling"]["windows"] == plain["protocol"]["sampling"]["windows"] == WINDOWS
    assert plain["protocol"]["simulation"]["pilot_on_copy"] is False  # no copy: the pass scores it
    assert default["protocol"]["simulation"]["pilot_on_copy"] is (cheap == "bfloat16")
    assert math.isclose(default["value"], plain["value"], rel_tol=5e-2)
    if cheap == "bfloat16":
        assert default["value"] != plain["value"]
        pilots = default["protocol"]["window_nll"][:8], plain["protocol"]["window_nll"][:8]
        assert pilots[0] != pilots[1] and pilots[0] == pytest.approx(pilots[1], rel=5e-2)
        timings = default["protocol"]["simulation"]["engine_timings_s"]
        assert 0 <= timings["cheap_windows_dense"] < timings["cheap_windows"]
    assert plain["protocol"]["simulation"]["dense_windows"] is None  # float32: no correction


def test_the_dense_models_bfloat16_windows_are_kept_with_its_baseline_and_reused(
    api: TestClient, start_worker: Any, tiny_model_dir: Path
) -> None:
    """Asked for bfloat16 (on any CPU), a SliceGPT job scores the dense model's bfloat16 windows its
    correction needs (the pilot's too: with no anchor it runs on the copy) and keeps them; a later
    curve of the same model and protocol reuses every one. With an anchor, which rests on the pass's
    pilot, the pilot stays in the pass and only the windows past it run on the copy."""
    worker = start_worker()
    model = str(tiny_model_dir)
    records, on_copy = [], []
    for sparsity, anchors in ((0.5, []), (0.4, [0.4])):
        body = simulate_body(
            model, sparsities=[sparsity], anchors=anchors, perplexity=_protocol(1e-4), window_dtype="bfloat16"
        )
        rows = [r for r in _run(api, worker, body) if r["source"] == "simulated" and r["law"] is None]
        (row,) = [r for r in rows if r["protocol"]["simulation"]["role"] == "simulated"]
        assert row["protocol"]["simulation"]["window_dtype"] == "bfloat16"
        on_copy.append(row["protocol"]["simulation"]["pilot_on_copy"])
        records.append(row["protocol"]["simulation"]["dense_windows"])
    assert on_copy == [True, False]
    assert records == [{"scored": WINDOWS, "reused": 0}, {"scored": 0, "reused": WINDOWS - 8}]


@pytest.mark.parametrize("method", ["magnitude", "wanda"])
def test_a_mask_curve_runs_its_windows_in_bfloat16_only_when_asked_and_is_then_not_exact(
    api: TestClient, start_worker: Any, tiny_model_dir: Path, method: str
) -> None:
    """A mask simulation stays in the model's dtype by default (magnitude's is the pruned model
    itself); asked for bfloat16, its pilot and further windows run on the copy, gap-corrected, and
    the row says so and no longer claims to be exact."""
    worker = start_worker()
    model = str(tiny_model_dir)
    runs = {}
    for asked in (None, "bfloat16"):
        body = simulate_body(
            model, method=method, sparsities=[0.5], anchors=[], perplexity=_protocol(1e-4), window_dtype=asked
        )
        runs[asked] = [r for r in _run(api, worker, body) if r["source"] == "simulated"]
    (plain,), (cheap,) = runs[None], runs["bfloat16"]
    said = plain["protocol"]["simulation"], cheap["protocol"]["simulation"]
    assert said[0]["window_dtype"] == "float32" and said[1]["window_dtype"] == "bfloat16"
    assert said[0]["exact"] is (method == "magnitude") and said[1]["exact"] is False
    assert said[0]["pilot_on_copy"] is False and said[1]["pilot_on_copy"] is True
    assert said[0]["dense_windows"] is None and said[1]["dense_windows"] == {"scored": WINDOWS, "reused": 0}
    assert plain["protocol"]["sampling"]["windows"] == cheap["protocol"]["sampling"]["windows"] == WINDOWS
    assert cheap["value"] != plain["value"] and math.isclose(cheap["value"], plain["value"], rel_tol=5e-2)
