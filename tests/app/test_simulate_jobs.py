"""`simulate` jobs: a simulated curve stored apart from measured points, anchored through the method
itself, refused up front where the method has no simulation."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from fastapi.testclient import TestClient

from tests.app.test_jobs_api import assert_problem
from tests.app.test_prune_jobs import prune_body, wait_done
from workers.simulation.streams_dtype import computes_bfloat16_natively

CALIBRATION = {"num_sequences": 4, "seqlen": 32, "batch_size": 2}
PERPLEXITY = {"seqlen": 64, "max_windows": 3}


def simulate_body(model: str, **overrides: Any) -> dict[str, Any]:
    return {
        "kind": "simulate",
        "model": model,
        "method": "slicegpt",
        "sparsities": [0.25, 0.5],
        "anchors": [0.25, 0.5],
        "calibration": CALIBRATION,
        "perplexity": PERPLEXITY,
        **overrides,
    }


def test_a_simulation_stores_simulated_anchor_and_anchored_points_apart_from_measured_ones(
    api: TestClient, start_worker: Any, tiny_model_dir: Path
) -> None:
    worker = start_worker()
    model = str(tiny_model_dir)
    every_window = {**PERPLEXITY, "precision": None}  # each point on all 3 windows, banded for the split
    calibration = {**CALIBRATION, "num_sequences": 12}  # three quarters: 9, so 5 batches of 2
    body = simulate_body(model, perplexity=every_window, calibration=calibration)
    job = api.post("/v1/jobs", json=body).json()
    done = wait_done(api, job["id"], worker)
    assert done["status"] == "succeeded", done

    rows = api.get("/v1/results", params={"job_id": job["id"], "limit": 50}).json()["items"]
    dense = [r for r in rows if r["method"] == "dense"]
    simulated = [r for r in rows if r["source"] == "simulated"]
    assert len(dense) == 1 and dense[0]["source"] == "measured"  # the baseline is measured, as a prune's
    by_role: dict[tuple[str, str | None], dict[float, float]] = {}
    for row in simulated:
        key = (row["protocol"]["simulation"]["role"], row["law"])
        by_role.setdefault(key, {})[row["sparsity"]] = row["value"]
        assert row["protocol"]["seqlen"] == 64 and row["protocol"]["dense_ppl"] == dense[0]["value"]
    face, anchors = by_role[("simulated", None)], by_role[("anchor", None)]
    # the face values' bases streamed in bfloat16 where this CPU computes it natively; anchors never
    cheap = "bfloat16" if computes_bfloat16_natively(torch.device("cpu")) else "float32"
    dtypes = {
        (r["protocol"]["simulation"]["role"], r["protocol"]["simulation"]["basis_dtype"]) for r in simulated
    }
    assert dtypes == {("simulated", cheap), ("anchor", None)}
    # bfloat16 streams take every calibration window; float32 ones three quarters, in whole batches
    face_rows = [r for r in simulated if r["protocol"]["simulation"]["role"] == "simulated"]
    windows = {r["protocol"]["simulation"]["basis_windows"] for r in face_rows}
    assert windows == {12 if cheap == "bfloat16" else 10}
    anchored = by_role[("simulated", "anchored")]
    assert set(face) == set(anchors) == set(anchored) == {0.25, 0.5}
    for sparsity in (0.25, 0.5):  # two anchors: the line in s passes through both
        assert math.isclose(anchored[sparsity], anchors[sparsity], rel_tol=1e-9)
    measured_only = api.get("/v1/results", params={"job_id": job["id"], "source": "measured"}).json()["items"]
    assert [r["method"] for r in measured_only] == ["dense"]
    assert len(api.get("/v1/results", params={"source": "simulated", "model": model}).json()["items"]) == 6

    # Only part of the split was scored: each face value carries its sampling band.
    band = next(r for r in simulated if r["law"] is None)["protocol"]["band"]
    assert band["windows"] == 3 and band["low"] < band["high"] and band["level"] == 0.95

    # The curve draws them as their own series; the measured points stay the dense one alone.
    params = {"metric": "ppl", "method": "slicegpt", "seqlen": 64, "max_windows": 3}
    curve = api.get(f"/v1/models/{model}/curves", params=params).json()
    assert curve["simulation_job_id"] == job["id"] and [p["sparsity"] for p in curve["measured"]] == [0.0]
    assert [p["value"] for p in curve["simulated"]] == [face[0.25], face[0.5]]
    assert [p["value"] for p in curve["anchored"]] == [anchored[0.25], anchored[0.5]]
    svg = api.get(f"/v1/models/{model}/curves", params={**params, "format": "svg"}).text
    assert "simulated, anchored" in svg
    report = api.get(f"/v1/jobs/{job['id']}/report").text  # the job's page draws the same series
    assert f"simulated by job {job['id']}" in report and "simulated, anchored" in report


def test_wanda_simulation_with_one_anchor_scales_by_a_constant(
    api: TestClient, start_worker: Any, tiny_model_dir: Path
) -> None:
    worker = start_worker()
    body = simulate_body(str(tiny_model_dir), method="wanda", sparsities=[0.3], anchors=[0.6])
    job = api.post("/v1/jobs", json=body).json()
    assert wait_done(api, job["id"], worker)["status"] == "succeeded"
    rows = api.get("/v1/results", params={"job_id": job["id"], "source": "simulated"}).json()["items"]
    [anchored] = [r for r in rows if r["law"] == "anchored" and r["sparsity"] == 0.6]
    [anchor] = [r for r in rows if r["protocol"]["simulation"]["role"] == "anchor"]
    assert anchored["protocol"]["anchored"]["form"] == "constant"
    # the anchor's own sparsity was simulated too, so the curve is anchored there and at 0.3
    assert sorted(r["sparsity"] for r in rows if r["law"] == "anchored") == [0.3, 0.6]
    assert math.isclose(anchored["value"], anchor["value"], rel_tol=1e-9)
    assert anchor["protocol"]["simulation"]["exact"] is True


def test_a_method_without_a_simulation_or_a_bad_option_is_refused_up_front(
    api: TestClient, tiny_model_dir: Path
) -> None:
    model = str(tiny_model_dir)
    assert_problem(api.post("/v1/jobs", json=simulate_body(model, method="shortgpt")), 422)
    assert_problem(api.post("/v1/jobs", json=simulate_body(model, method="wanda", bases="dense")), 422)
    assert_problem(api.post("/v1/jobs", json=simulate_body(model, basis_windows=99)), 422)
    assert_problem(
        api.post("/v1/jobs", json=simulate_body(model, method="wanda", basis_dtype="float32")), 422
    )
    assert_problem(api.post("/v1/jobs", json=simulate_body(model, basis_dtype="float16")), 422)
    for refused in (
        dict(layout="stock", window_dtype="bfloat16"),
        dict(window_dtype="bfloat16", perplexity={**PERPLEXITY, "precision": None}),  # no further windows
        dict(window_dtype="float16"),
    ):
        problem = api.post("/v1/jobs", json=simulate_body(model, **refused))
        assert_problem(problem, 422)
        assert "window_dtype" in problem.text
    assert_problem(api.post("/v1/jobs", json=simulate_body(model, bases="dense", basis_windows=2)), 422)
    assert_problem(api.post("/v1/jobs", json=simulate_body(model, sparsities=[0.99])), 422)


def test_data_free_and_stock_simulations_are_marked_exact(
    api: TestClient, start_worker: Any, tiny_model_dir: Path
) -> None:
    """Magnitude reads no calibration; the stock layout's one basis is the method's own: both are the
    pruned model itself, and say so."""
    worker = start_worker()
    model = str(tiny_model_dir)
    for overrides, stored in (
        (dict(method="magnitude"), "magnitude"),
        (dict(layout="stock"), "slicegpt-stock"),
    ):
        job = api.post("/v1/jobs", json=simulate_body(model, anchors=[], **overrides)).json()
        assert wait_done(api, job["id"], worker)["status"] == "succeeded"
        rows = api.get("/v1/results", params={"job_id": job["id"], "source": "simulated"}).json()["items"]
        assert {r["method"] for r in rows} == {stored} and len(rows) == 2
        assert all(r["protocol"]["simulation"]["exact"] for r in rows)


TASK_ACCURACY = {"tasks": ["arc_easy"], "limit": 4, "batch_size": 8}


def _simulated_scores(api: TestClient, job_id: str) -> dict[tuple[float, str, str], dict[str, Any]]:
    """(sparsity, task, metric) -> the simulated task row."""
    rows = api.get("/v1/results", params={"job_id": job_id, "source": "simulated", "limit": 100}).json()
    return {(r["sparsity"], r["dataset"], r["metric"]): r for r in rows["items"] if r["metric"] != "ppl"}


def test_a_magnitude_simulation_scores_tasks_as_its_pruned_model_does(
    api: TestClient, start_worker: Any, tiny_model_dir: Path
) -> None:
    """Magnitude's simulated model is its pruned model: the task scores of a simulation equal those of
    a prune job at the same sparsity, and each row names the dense score it compares with."""
    worker = start_worker()
    model = str(tiny_model_dir)
    body = simulate_body(model, method="magnitude", sparsities=[0.3, 0.6], anchors=[], accuracy=TASK_ACCURACY)
    job = api.post("/v1/jobs", json=body).json()
    wait_done(api, job["id"], worker)
    scores = _simulated_scores(api, job["id"])
    assert set(scores) == {(s, "arc_easy", m) for s in (0.3, 0.6) for m in ("acc", "acc_norm")}
    dense_query = {"model": model, "method": "dense", "metric": "acc"}
    dense = api.get("/v1/results", params=dense_query).json()["items"]
    for row in scores.values():
        assert row["dataset"] == "arc_easy" and row["n"] == 4 and row["source"] == "simulated"
        simulation = row["protocol"]["simulation"]
        assert simulation["role"] == "simulated" and simulation["exact"] is True
        if row["metric"] == "acc":
            assert row["protocol"]["dense_value"] == dense[0]["value"]
    # Before any prune, an accuracy question is answered by the simulated rung, exact for magnitude.
    question = {
        "model": model,
        "method": "magnitude",
        "sparsities": [0.3, 0.45],
        "metrics": [{"metric": "acc", "task": "arc_easy"}],
        "protocol": {"seqlen": 64, "max_windows": 3},
    }
    answered = api.post("/v1/predictions", json=question)
    assert answered.status_code == 200, answered.text
    at_30, at_45 = answered.json()["metrics"][0]["predictions"]
    assert at_30["rung"] == "simulated" and at_30["value"] == scores[(0.3, "arc_easy", "acc")]["value"]
    assert at_30["verdict"]["level"] == "exact" and 0.0 <= at_30["band"][0] <= at_30["band"][1] <= 1.0
    assert at_45["rung"] == "simulated" and "interpolated" in at_45["flags"]
    for sparsity in (0.3, 0.6):
        prune = prune_body(model, sparsity, method="magnitude", accuracy=TASK_ACCURACY, perplexity=PERPLEXITY)
        pruned_job = api.post("/v1/jobs", json=prune).json()
        wait_done(api, pruned_job["id"], worker)
        pruned = api.get("/v1/results", params={"job_id": pruned_job["id"], "limit": 50}).json()["items"]
        measured = {r["metric"]: r["value"] for r in pruned if r["metric"] in ("acc", "acc_norm")}
        assert measured == {m: scores[(sparsity, "arc_easy", m)]["value"] for m in ("acc", "acc_norm")}


def test_a_slicing_simulation_scores_multiple_choice_and_lambada_on_its_projected_model(
    api: TestClient, start_worker: Any, tiny_model_dir: Path
) -> None:
    """Generation (LAMBADA's greedy last word, a KV cache) runs through the projected blocks too; the
    measured points stay the dense ones alone."""
    worker = start_worker()
    model = str(tiny_model_dir)
    accuracy = {"tasks": ["arc_easy", "lambada_openai"], "limit": 3, "batch_size": 4}
    job = api.post(
        "/v1/jobs", json=simulate_body(model, sparsities=[0.5], anchors=[], accuracy=accuracy)
    ).json()
    wait_done(api, job["id"], worker)
    scores = _simulated_scores(api, job["id"])
    assert {(0.5, "arc_easy", "acc"), (0.5, "lambada_openai", "acc")} <= set(scores)
    for row in scores.values():
        assert (
            row["protocol"]["simulation"]["width"] is not None
            and row["protocol"]["simulation"]["exact"] is False
        )
        assert math.isfinite(row["value"])
    measured = api.get("/v1/results", params={"job_id": job["id"], "source": "measured", "limit": 50}).json()
    assert {r["method"] for r in measured["items"]} == {"dense"}
