"""`sweep` jobs: validated at submit, run through a real RQ worker on Postgres + Redis, one dense
baseline, every sparsity stored like a prune job's, the laws fitted and stored, cancel mid-sweep."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from core.settings import Settings
from core.specs.jobs import MAX_SWEEP_SPARSITIES
from tests.app.test_jobs_api import assert_problem
from tests.app.test_prune_jobs import job_results, log_entries, prune_body, wait_done
from tests.conftest import wait_for

SPARSITIES = [0.1, 0.25, 0.5]


def sweep_body(model: str, sparsities: list[float] | None = None, **overrides: Any) -> dict[str, Any]:
    return {
        "kind": "sweep",
        "model": model,
        "method": "slicegpt",
        "sparsities": SPARSITIES if sparsities is None else sparsities,
        "calibration": {"num_sequences": 4, "seqlen": 32, "batch_size": 2},
        "perplexity": {"seqlen": 64, "max_windows": 2},
        **overrides,
    }


def items(api: TestClient, path: str, **params: Any) -> list[dict[str, Any]]:
    response = api.get(path, params=params)
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()["items"]
    return found


def test_sweep_measures_every_sparsity_against_one_dense_baseline_and_stores_the_fit(
    api: TestClient, start_worker: Any, tiny_model_dir: Path
) -> None:
    worker = start_worker()
    body = sweep_body(str(tiny_model_dir), [0.0, *SPARSITIES], save_artifacts=True)
    submitted = api.post("/v1/jobs", json=body)
    assert submitted.status_code == 202, submitted.text
    job = submitted.json()
    assert job["kind"] == "sweep" and job["request"]["sparsities"] == [0.0, *SPARSITIES]
    done = wait_done(api, job["id"], worker)
    assert done["stage"] == "done" and done["progress"] == 1.0

    results = items(api, f"/v1/jobs/{job['id']}/results")
    dense = [item for item in results if item["method"] == "dense"]
    assert len(dense) == 1 and dense[0]["sparsity"] == 0.0 and dense[0]["metric"] == "ppl"
    assert [item["id"] for item in items(api, "/v1/results", method="dense")] == [dense[0]["id"]]
    ppl = {
        item["sparsity"]: item for item in results if item["method"] == "slicegpt" and item["metric"] == "ppl"
    }
    fraction = {item["sparsity"]: item for item in results if item["metric"] == "param_fraction_removed"}
    assert sorted(ppl) == sorted(fraction) == SPARSITIES
    calibrations = set()
    for sparsity, item in ppl.items():
        protocol = item["protocol"]
        assert (
            protocol["sweep_job_id"] == job["id"]
            and fraction[sparsity]["protocol"]["sweep_job_id"] == job["id"]
        )
        assert protocol["method"] == "slicegpt" and protocol["dense_result_id"] == dense[0]["id"]
        assert protocol["dense_reused"] is False and protocol["seqlen"] == 64 and protocol["windows"] == 2
        assert protocol["slicing"]["sparsity"] == sparsity
        assert protocol["artifact"] == str(Path(protocol["artifact"]).parent / f"s{sparsity}")
        assert fraction[sparsity]["value"] == protocol["slicing"]["param_fraction_removed"]
        assert item["value"] > 1 and protocol["timings"]["slicing_s"] >= 0 and protocol["torch"]
        calibrations.add(tuple(sorted((k, str(v)) for k, v in protocol["calibration"].items())))
    assert len(calibrations) == 1  # every sparsity was sliced with the same windows
    assert [ppl[s]["protocol"]["slicing"]["width"] for s in SPARSITIES] == [56, 48, 32]
    queried = items(api, "/v1/results", method="slicegpt", metric="ppl", sparsity_min=0.2, sparsity_max=0.3)
    assert [item["id"] for item in queried] == [ppl[0.25]["id"]]
    # save_artifacts: every sliced model under <artifacts>/<job id>/s<sparsity>, listed with the job.
    artifacts = items(api, f"/v1/jobs/{job['id']}/artifacts")
    assert [Path(a["path"]).name for a in artifacts] == ["s0.1", "s0.25", "s0.5"]
    assert all(Path(a["path"]).parent.name == job["id"] and a["kind"] == "sliced-model" for a in artifacts)
    assert [ppl[s]["protocol"]["artifact"] for s in SPARSITIES] == [a["path"] for a in artifacts]
    assert [item["id"] for item in queried] == [ppl[0.25]["id"]]

    fits = items(api, "/v1/fits", job_id=job["id"])
    assert len(fits) == 1
    fit = fits[0]
    assert fit["model"] == str(tiny_model_dir) and fit["method"] == "slicegpt" and fit["metric"] == "ppl"
    assert fit["dataset"] == "wikitext2" and fit["baseline"] == dense[0]["value"]
    assert fit["law"] in ("alpha", "affine") and fit["params"] and fit["chosen_reason"]
    assert set(fit["quality"]) == {"alpha", "affine", "strict"}
    for quality in fit["quality"].values():
        assert quality["n"] == 3 and quality["max_ape"] >= quality["mean_ape"] >= 0
    assert [(p["sparsity"], p["value"], p["result_id"]) for p in fit["points"]] == [
        (0.0, dense[0]["value"], dense[0]["id"]),
        *((s, ppl[s]["value"], ppl[s]["id"]) for s in SPARSITIES),
    ]
    protocol = fit["protocol"]
    assert protocol["seqlen"] == 64 and protocol["max_windows"] == 2 and protocol["dtype"] == "float32"
    assert protocol["calibration"]["num_sequences"] == 4 and protocol["round_to"] == 8
    assert protocol["slice_head"] is False
    by_model = items(api, "/v1/fits", model=str(tiny_model_dir), method="slicegpt", metric="ppl")
    assert [item["id"] for item in by_model] == [fit["id"]]

    # Progress names the sparsity and its place in the sweep. The worker logs what it writes, and
    # writes within 0.5 s of each other are coalesced unless the stage changes, so only stage
    # changes are certain here; tests/workers/test_sweep_kind.py checks every detail.
    details = {entry.get("detail") for entry in log_entries(worker.output())}
    assert {"s=0.1 (1/3): block 0/2", "s=0.25 (2/3): fresh dense copy", "perplexity laws"} <= details

    # A prune job with the same fields measures the very same number, reusing the baseline.
    prune = api.post("/v1/jobs", json=prune_body(str(tiny_model_dir), 0.25, save_artifact=False)).json()
    wait_done(api, prune["id"], worker)
    pruned = job_results(api, prune["id"])
    assert set(pruned) == {"slicegpt/ppl", "slicegpt/param_fraction_removed"}
    assert pruned["slicegpt/ppl"]["value"] == pytest.approx(ppl[0.25]["value"], rel=1e-6)
    assert pruned["slicegpt/ppl"]["protocol"]["dense_result_id"] == dense[0]["id"]
    assert pruned["slicegpt/param_fraction_removed"]["value"] == fraction[0.25]["value"]


def test_cancel_mid_sweep_stops_at_a_safe_point_and_keeps_nothing_it_stored(
    api: TestClient, start_worker: Any, tiny_model_dir: Path, rq_settings: Settings
) -> None:
    worker = start_worker()
    sparsities = [round(0.05 * i, 2) for i in range(1, 18)]  # up to 0.85: D = 64 keeps 8 dimensions
    body = sweep_body(
        str(tiny_model_dir), sparsities, perplexity={"seqlen": 64, "max_windows": 8}, save_artifacts=True
    )
    job = api.post("/v1/jobs", json=body).json()
    wait_for(
        lambda: re.search(r"\((?:[3-9]|1\d)/\d+\)", api.get(f"/v1/jobs/{job['id']}").json()["detail"] or ""),
        timeout=90,
        what="the sweep to reach its third sparsity",
        interval=0.05,
    )
    stored = items(api, f"/v1/jobs/{job['id']}/results")
    assert any(r["method"] == "slicegpt" for r in stored) and items(api, f"/v1/jobs/{job['id']}/artifacts")
    canceled = api.delete(f"/v1/jobs/{job['id']}")
    assert canceled.status_code == 202, canceled.text
    done = api.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 60}).json()
    assert done["status"] == "canceled", (done, worker.output()[-3000:])

    # Nothing partial: no point, no dense baseline for later jobs to reuse, no fit, no model on disk.
    assert items(api, f"/v1/jobs/{job['id']}/results") == []
    assert items(api, "/v1/results", job_id=job["id"]) == []
    assert items(api, "/v1/fits", job_id=job["id"]) == []
    assert items(api, f"/v1/jobs/{job['id']}/artifacts") == []
    assert not (rq_settings.artifacts_dir / job["id"]).exists()


@pytest.mark.parametrize(
    ("sparsities", "fragment"),
    [
        ([], "at least 1"),
        ([0.1, 1.0], "less than 1"),
        ([-0.1, 0.2], "greater than or equal to 0"),
        ([0.0], "at least one sparsity above 0"),
        ([0.0, 0.0], "at least one sparsity above 0"),
        ([round(0.01 * i, 2) for i in range(1, MAX_SWEEP_SPARSITIES + 2)], "at most 20"),
    ],
)
def test_invalid_sparsity_lists_are_a_422_naming_the_field(
    api: TestClient, tiny_model_dir: Path, sparsities: list[float], fragment: str
) -> None:
    body = assert_problem(api.post("/v1/jobs", json=sweep_body(str(tiny_model_dir), sparsities)), 422)
    errors = [error for error in body["errors"] if "sparsities" in error["loc"]]
    assert errors and any(fragment in error["msg"] for error in errors), body


def test_sparsities_are_sorted_and_duplicates_collapse(api: TestClient, tiny_model_dir: Path) -> None:
    many = [0.5, 0.1, 0.25, 0.1, 0.0, 0.5, *[0.25] * MAX_SWEEP_SPARSITIES]
    response = api.post("/v1/jobs", json=sweep_body(str(tiny_model_dir), many))
    assert response.status_code == 202, response.text
    assert response.json()["request"]["sparsities"] == [0.0, 0.1, 0.25, 0.5]
    # The stored request is the normalised one: the same sweep in another order is the same request.
    key = {"Idempotency-Key": "sweep-normalised"}
    first = api.post("/v1/jobs", json=sweep_body(str(tiny_model_dir), [0.5, 0.1]), headers=key)
    again = api.post("/v1/jobs", json=sweep_body(str(tiny_model_dir), [0.1, 0.5, 0.1]), headers=key)
    assert first.status_code == 202 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"]


def test_sweep_refuses_a_sparsity_that_leaves_no_dimension_and_unsupported_models(
    api: TestClient, tiny_model_dir: Path, model_root: Path
) -> None:
    # D = 64: (1 - 0.9) * 64 = 6.4 -> 6, rounded down to a multiple of 8 -> 0.
    body = assert_problem(api.post("/v1/jobs", json=sweep_body(str(tiny_model_dir), [0.1, 0.9])), 422)
    assert body["type"].endswith("/invalid-sparsity") and "sparsity 0.9 leaves no dimension" in body["detail"]
    folder = model_root / "unsupported-bloom-sweep"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text('{"model_type": "bloom", "architectures": ["BloomForCausalLM"]}')
    body = assert_problem(api.post("/v1/jobs", json=sweep_body(str(folder))), 422)
    assert body["type"].endswith("/unsupported-architecture")
    assert api.get("/v1/jobs").json()["items"] == []


def test_sweep_request_is_documented_in_openapi(api: TestClient) -> None:
    schemas = api.get("/openapi.json").json()["components"]["schemas"]
    sweep = schemas["SweepJobCreate"]["properties"]
    assert sweep["sparsities"]["maxItems"] >= MAX_SWEEP_SPARSITIES
    assert "deduplicated" in sweep["sparsities"]["description"]
    assert sweep["save_artifacts"]["default"] is False


def test_sweep_with_accuracy_scores_every_sparsity_against_one_dense_accuracy_and_fits_it(
    api: TestClient, start_worker: Any, tiny_model_dir: Path
) -> None:
    worker = start_worker()
    body = sweep_body(
        str(tiny_model_dir),
        [0.1, 0.5],
        perplexity={"seqlen": 64, "max_windows": 1},
        accuracy={"tasks": ["arc_easy"], "limit": 4},
    )
    job = api.post("/v1/jobs", json=body).json()
    done = wait_done(api, job["id"], worker)
    assert done["stage"] == "done" and done["progress"] == 1.0

    results = items(api, f"/v1/jobs/{job['id']}/results")
    by_key = {(r["method"], r["sparsity"], r["metric"], r["dataset"]): r for r in results}
    dense_acc = [r for r in results if r["method"] == "dense" and r["dataset"] == "arc_easy"]
    assert sorted(r["metric"] for r in dense_acc) == ["acc", "acc_norm"]  # one dense accuracy only
    for metric in ("acc", "acc_norm"):
        dense = by_key[("dense", 0.0, metric, "arc_easy")]
        for sparsity in (0.1, 0.5):
            row = by_key[("slicegpt", sparsity, metric, "arc_easy")]
            assert 0.0 <= row["value"] <= 1.0 and row["n"] == 4
            assert row["protocol"]["sweep_job_id"] == job["id"]
            assert row["protocol"]["dense_result_id"] == dense["id"]
    assert len([r for r in results if r["metric"] in ("acc", "acc_norm")]) == 6

    fits = {(f["metric"], f["dataset"]): f for f in items(api, "/v1/fits", job_id=job["id"])}
    assert ("ppl", "wikitext2") in fits and ("acc", "arc_easy") in fits
    assert set(fits) <= {("ppl", "wikitext2"), ("acc", "arc_easy"), ("acc_norm", "arc_easy")}
    assert set(fits[("ppl", "wikitext2")]["quality"]) == {"alpha", "affine", "strict"}
    acc_fit = fits[("acc", "arc_easy")]
    dense = by_key[("dense", 0.0, "acc", "arc_easy")]
    assert acc_fit["baseline"] == dense["value"] and acc_fit["law"] in ("slope", "affine", "prior")
    assert acc_fit["quality"] and all("n" in q and "r2" in q for q in acc_fit["quality"].values())
    assert acc_fit["protocol"]["limit"] == 4 and acc_fit["protocol"]["n_options"] >= 2
    assert [(p["sparsity"], p["result_id"]) for p in acc_fit["points"]] == [
        (0.0, dense["id"]),
        *((s, by_key[("slicegpt", s, "acc", "arc_easy")]["id"]) for s in (0.1, 0.5)),
    ]


@pytest.mark.parametrize(("method", "sparsities"), [("wanda", [0.3, 0.5]), ("shortgpt", [0.5])])
def test_every_method_sweeps_and_its_fit_is_an_empirical_curve_without_the_strict_law(
    api: TestClient, start_worker: Any, tiny_model_dir: Path, method: str, sparsities: list[float]
) -> None:
    worker = start_worker()
    job = api.post("/v1/jobs", json=sweep_body(str(tiny_model_dir), sparsities, method=method)).json()
    wait_done(api, job["id"], worker)
    pruned = [
        r for r in items(api, f"/v1/jobs/{job['id']}/results") if r["metric"] == "ppl" and r["sparsity"] > 0
    ]
    assert sorted(r["sparsity"] for r in pruned) == sparsities and {r["method"] for r in pruned} == {method}
    [fit] = items(api, "/v1/fits", job_id=job["id"])
    assert fit["method"] == method and fit["law"].startswith("empirical-")
    assert "strict" not in fit["quality"] and "strict law is a slicing law" in fit["chosen_reason"]
    assert "round_to" not in fit["protocol"] and fit["protocol"]["calibration"]["num_sequences"] == 4


def test_a_sweep_that_drops_every_layer_is_refused_at_submit(api: TestClient, tiny_model_dir: Path) -> None:
    body = sweep_body(str(tiny_model_dir), [0.5, 0.9], method="shortgpt")  # round(0.9 * 2) = both layers
    problem = assert_problem(api.post("/v1/jobs", json=body), 422)
    assert problem["type"].endswith("/invalid-sparsity")
