"""`profile` jobs: one dense pass stored as a profile that the profile endpoint draws, the backtests
score and predictions use, before the model is pruned and after."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from core.prediction.fits import MeasuredPoint, ppl_fit
from core.store import Store
from tests.app.store_points import add_series, ppl_protocol
from tests.app.test_jobs_api import assert_problem
from tests.app.test_prune_jobs import wait_done
from tests.app.test_sweep_jobs import sweep_body

CALIBRATION = {"num_sequences": 4, "seqlen": 32, "batch_size": 2}


def profile_body(model: str, **overrides: Any) -> dict[str, Any]:
    return {
        "kind": "profile",
        "model": model,
        "calibration": CALIBRATION,
        "sparsities": [0.1, 0.25, 0.5],
        **overrides,
    }


def predict(api: TestClient, model: str, sparsities: list[float]) -> dict[str, Any]:
    body = {"model": model, "sparsities": sparsities, "protocol": {"seqlen": 64, "max_windows": 2}}
    response = api.post("/v1/predictions", json=body)
    assert response.status_code == 200, response.text
    [metric] = response.json()["metrics"]
    return metric  # type: ignore[no-any-return]


def prediction_body(model: str, method: str) -> dict[str, Any]:
    return {
        "model": model,
        "method": method,
        "sparsities": [0.5],
        "protocol": {"seqlen": 64, "max_windows": 2},
    }


def test_a_profile_predicts_before_pruning_and_its_predictors_are_backtested_once_measured(
    api: TestClient, start_worker: Any, tiny_model_dir: Path
) -> None:
    worker = start_worker()
    model = str(tiny_model_dir)
    profile_job = api.post("/v1/jobs", json=profile_body(model)).json()
    done = wait_done(api, profile_job["id"], worker)
    assert done["stage"] == "done"

    profile = api.get(f"/v1/models/{model}/profile").json()
    assert profile["job_id"] == profile_job["id"] and profile["widths"] == [56, 48, 32]
    layers = profile["num_layers"]
    assert [s["name"] for s in profile["signals"][:3]] == ["embedding", "block 0 pre-mlp", "block 0 output"]
    assert len(profile["signals"]) == 1 + 2 * layers
    for signal in profile["signals"]:
        assert all(0.0 <= share <= 1.0 for share in signal["discarded"] + signal["token_discarded"])
        assert signal["discarded"] == sorted(signal["discarded"])  # a narrower width discards more
        assert [r["width"] for r in signal["lens"]] == [56, 48, 32] and signal["eigenvalues"] is None
    assert profile["calibration"]["num_sequences"] == 4 and profile["calibration"]["seed"] == 42
    heatmap = api.get(f"/v1/models/{model}/profile", params={"format": "svg"})
    assert heatmap.status_code == 200 and heatmap.headers["content-type"].startswith("image/svg+xml")
    assert_problem(api.get(f"/v1/models/{model}/profile", params={"seed": 7}), 404)
    report = api.get(f"/v1/jobs/{profile_job['id']}/report")
    assert report.status_code == 200 and "discarded token energy per signal and width" in report.text
    assert "<svg" in report.text

    # Measured dense only: the profile answers alone, with the lens-KL sum at face value.
    evaluate = {"kind": "evaluate", "model": model, "perplexity": {"seqlen": 64, "max_windows": 2}}
    wait_done(api, api.post("/v1/jobs", json=evaluate).json()["id"], worker)
    before = predict(api, model, [0.25])["before_pruning"]
    assert before["own_points"] == 0 and before["profile_job_id"] == profile_job["id"]
    assert before["chosen"] == "feature law: lens-kl-sum"
    assert before["reason"].startswith("pre-registered for slicegpt") and "face value" in before["reason"]
    assert before["verdict"]["level"] == "unscored"  # no measured curve: nothing has judged it
    [face] = before["predictors"]  # no curve in the store: only the law that needs none answers
    [predicted] = face["predictions"]
    assert predicted["width"] == 48 and predicted["band"][0] < predicted["value"] < predicted["band"][1]

    # A sweep under the same calibration: its points update every feature law and are backtested.
    sweep = api.post("/v1/jobs", json=sweep_body(model, [0.1, 0.25], calibration=CALIBRATION)).json()
    wait_done(api, sweep["id"], worker)
    after = predict(api, model, [0.5])["before_pruning"]
    assert after["own_points"] == 2 and after["mode"] == "one-point"
    assert {p["feature"] for p in after["predictors"]} >= {"lens-kl-sum", "token-energy-mean"}
    assert all(p["coefficient"]["points"] == 2 for p in after["predictors"])

    curve = api.get(f"/v1/models/{model}/curves", params={"seqlen": 64, "max_windows": 2}).json()
    assert curve["profile_predictor"] == after["chosen"]
    assert curve["profile_predicted"][-1]["sparsity"] == 0.5  # the profile's largest sparsity
    drawn = api.get(f"/v1/models/{model}/curves", params={"seqlen": 64, "max_windows": 2, "format": "svg"})
    assert drawn.status_code == 200 and "from the profile" in drawn.text
    # the drawn answer reaches 0.9, which leaves no width of this 64-wide model: the profile's
    # predictions say why not there instead of failing the curve (a 500 before)
    assert curve["answer"][-1]["sparsity"] == 0.9 and curve["answer"][-1]["rung"] == "law"

    backtests = api.get("/v1/backtests", params={"points": True}).json()
    [curve] = backtests["curves"]
    assert curve["model"] == model and "lens-kl-sum" in curve["features"]
    scored = {(item["predictor"], item["mode"]): item for item in backtests["items"]}
    assert scored[("strict law", "zero-points, leave-one-curve-out")]["n"] == 2
    one_point = scored[("feature law: token-energy-mean", "one-point")]
    assert one_point["n"] == 2 and {p["sparsity"] for p in one_point["points"]} == {0.1, 0.25}


def test_profile_requests_are_checked_on_submit(api: TestClient, tiny_model_dir: Path) -> None:
    assert_problem(api.post("/v1/jobs", json=profile_body(str(tiny_model_dir), sparsities=[1.0])), 422)
    assert_problem(api.post("/v1/jobs", json=profile_body(str(tiny_model_dir), lens_tokens=-1)), 422)
    assert_problem(api.get("/v1/models/no-such-model/profile"), 404)


def test_a_profile_measured_on_other_windows_records_them(
    api: TestClient, start_worker: Any, tiny_model_dir: Path
) -> None:
    worker = start_worker()
    measured_on = {"num_sequences": 2, "seqlen": 32, "batch_size": 2, "seed": 5}
    job = api.post("/v1/jobs", json=profile_body(str(tiny_model_dir), measured_on=measured_on)).json()
    wait_done(api, job["id"], worker)
    profile = api.get(f"/v1/models/{tiny_model_dir}/profile", params={"spectra": True}).json()
    assert profile["protocol"]["measured_on"]["seed"] == 5 and profile["protocol"]["measured_tokens"] == 64
    assert profile["calibration"]["seed"] == 42  # the basis is still the calibration's
    signal = profile["signals"][-1]
    assert sum(signal["energy"]) == pytest.approx(1.0) and signal["energy"] != signal["token_energy"]
    assert profile["protocol"]["measured_on"]["disjoint_from"] == "the calibration windows"

    unseeded = {key: value for key, value in measured_on.items() if key != "seed"}
    job = api.post("/v1/jobs", json=profile_body(str(tiny_model_dir), measured_on=unseeded)).json()
    wait_done(api, job["id"], worker)
    profile = api.get(f"/v1/models/{tiny_model_dir}/profile").json()
    held_out = profile["protocol"]["measured_on"]
    assert held_out["seed"] != profile["calibration"]["seed"] == 42  # never the calibration's windows
    assert held_out["disjoint_from"] == "the calibration windows"


MASK_FEATURES = {"output-error-mean", "output-error-depth-sum", "output-error-weighted", "output-error-max"}


def test_intra_layer_methods_are_predicted_from_the_profiles_mask_errors(
    api: TestClient, start_worker: Any, tiny_model_dir: Path
) -> None:
    worker = start_worker()
    model = str(tiny_model_dir)
    calibrations = [CALIBRATION, {**CALIBRATION, "seed": 7}]  # two curves of one model
    profile_jobs = []
    for calibration in calibrations:
        profile = profile_body(model, calibration=calibration, sparsities=[0.25, 0.5], lens_tokens=0)
        profile_jobs.append(api.post("/v1/jobs", json=profile).json()["id"])
        wait_done(api, profile_jobs[-1], worker)
        sweep = sweep_body(model, [0.25, 0.5], method="wanda", calibration=calibration)
        wait_done(api, api.post("/v1/jobs", json=sweep).json()["id"], worker)

    profile = api.get(f"/v1/models/{model}/profile", params={"linears": True}).json()
    assert set(profile["mask_features"]) == {"wanda", "sparsegpt", "magnitude", "magnitude-row"}
    wanda = profile["mask_features"]["wanda"]
    assert set(wanda) == MASK_FEATURES and all(0 < a < b for a, b in wanda.values())
    assert len(profile["linears"]) == 7 * profile["num_layers"]
    assert set(profile["linears"][0]["errors"]) == {"wanda", "magnitude", "magnitude-row"}
    drawn = api.get(f"/v1/models/{model}/profile", params={"format": "svg", "rule": "magnitude"})
    assert drawn.status_code == 200 and "magnitude mask removes" in drawn.text

    backtests = api.get("/v1/backtests", params={"method": "wanda", "points": True}).json()
    assert len(backtests["curves"]) == 2
    assert all(set(c["features"]) == MASK_FEATURES for c in backtests["curves"])
    scored = {(item["predictor"], item["mode"]): item for item in backtests["items"]}
    held_out = scored[("feature law: output-error-depth-sum", "zero-points, leave-one-curve-out")]
    assert held_out["n"] == 4 and held_out["curves"] == 2
    assert not any(predictor == "strict law" for predictor, _ in scored)  # a law of slicing only

    body = prediction_body(model, "wanda")
    [metric] = api.post("/v1/predictions", json=body).json()["metrics"]
    before = metric["before_pruning"]
    assert before["own_points"] == 2 and before["mode"] == "one-point"  # the newest profile: seed 7
    assert before["features_from"].startswith("the output error of Wanda's masks")
    assert {p["feature"] for p in before["predictors"]} == MASK_FEATURES
    assert before["chosen"] == "feature law: output-error-depth-sum"  # registered, not the best scored
    assert before["reason"].startswith("pre-registered for wanda")
    assert before["verdict"]["level"] in {"reliable", "rough", "unreliable"}
    assert "typical miss" in before["verdict"]["advice"] and before["verdict"]["models"] == 1
    assert all(p["predictions"][0]["width"] is None for p in before["predictors"])
    assert before["profile_job_id"] == profile_jobs[1]
    for seed, profile_job in ((42, profile_jobs[0]), (99, None)):  # the profile of the prune's windows
        [metric] = api.post("/v1/predictions", json={**body, "calibration": {"seed": seed}}).json()["metrics"]
        chosen = metric["before_pruning"]
        assert (chosen and chosen["profile_job_id"]) == profile_job
    sliced = api.post("/v1/predictions", json={**body, "method": "slicegpt"})
    assert sliced.status_code == 200, sliced.text  # the dense baseline is shared by every method
    [metric] = sliced.json()["metrics"]
    slicing = metric["before_pruning"]  # the mask errors never answer for slicing
    assert slicing is not None and slicing["features_from"].startswith("slicing's spectra")
    assert all(p["feature"] not in MASK_FEATURES for p in slicing["predictors"])


def test_a_family_slicing_refuses_is_profiled_for_the_intra_layer_methods(
    api: TestClient, start_worker: Any, model_root: Path
) -> None:
    from tests.tiny_models import build_tiny_causal_lm

    worker = start_worker()
    model = str(build_tiny_causal_lm(model_root / "tiny-gemma1", "gemma"))
    job = api.post("/v1/jobs", json=profile_body(model, lens_tokens=0))
    assert job.status_code == 202, job.text
    wait_done(api, job.json()["id"], worker)
    profile = api.get(f"/v1/models/{model}/profile").json()
    assert "cannot be folded" in profile["protocol"]["slicing_refusal"]
    assert {s["kind"] for s in profile["signals"]} == {"embedding", "output"}
    assert "wanda" in profile["mask_features"]
    assert_problem(api.post("/v1/jobs", json=sweep_body(model, [0.25])), 422)  # slicing still refuses it
    report = api.get(f"/v1/jobs/{job.json()['id']}/report")
    assert report.status_code == 200 and "mask removes from each block linear" in report.text


def test_a_method_never_run_on_a_model_is_predicted_from_the_methods_that_were(
    api: TestClient, start_worker: Any, clean_store: Store, tiny_model_dir: Path, model_root: Path
) -> None:
    from tests.tiny_models import build_tiny_causal_lm

    worker = start_worker()
    seen, new = str(tiny_model_dir), str(build_tiny_causal_lm(model_root / "tiny-llama-seed-1", seed=1))
    features, calibrations = {}, {}
    for model in (seen, new):
        job = api.post("/v1/jobs", json=profile_body(model, sparsities=[0.25, 0.5], lens_tokens=0)).json()
        wait_done(api, job["id"], worker)
        profile = api.get(f"/v1/models/{model}/profile").json()
        features[model] = profile["mask_features"]["wanda"]["output-error-mean"]  # at 0.25 and 0.5
        calibrations[model] = profile["calibration"]
    # Wanda measured on both models, SparseGPT only on the one seen before; the new model is the
    # more sensitive one under Wanda.
    measured = {
        (seen, "wanda"): (110.0, 150.0),
        (new, "wanda"): (130.0, 260.0),
        (seen, "sparsegpt"): (105.0, 125.0),
    }
    with clean_store.session() as session:
        for (model, method), (at_quarter, at_half) in measured.items():
            points = [MeasuredPoint(0.25, at_quarter), MeasuredPoint(0.5, at_half)]
            protocol = {**ppl_protocol(seqlen=64, max_windows=2), "calibration": calibrations[model]}
            session.add(
                ppl_fit(
                    model_id=model,
                    model_revision=None,
                    method=method,
                    dataset="wikitext2",
                    protocol=protocol,
                    dense=MeasuredPoint(0.0, 100.0),
                    points=points,
                    strict_law=False,
                )
            )
    add_series(clean_store, new, 100.0, [], protocol=ppl_protocol(seqlen=64, max_windows=2))

    def coefficient(model: str, method: str) -> float:  # least squares through the dense point
        ys = [math.log(v / 100.0) for v in measured[(model, method)]]
        fs = features[model]
        return sum(f * y for f, y in zip(fs, ys, strict=True)) / sum(f * f for f in fs)

    body = prediction_body(new, "sparsegpt")
    response = api.post("/v1/predictions", json=body)
    assert response.status_code == 200, response.text
    before = response.json()["metrics"][0]["before_pruning"]
    assert before["mode"] == "zero-points, other methods of the model" and before["own_points"] == 0
    law = next(p for p in before["predictors"] if p["predictor"] == "feature law: output-error-mean")
    expected = coefficient(seen, "sparsegpt") * coefficient(new, "wanda") / coefficient(seen, "wanda")
    assert law["coefficient"]["value"] == pytest.approx(expected, rel=1e-9)
    assert law["coefficient"]["source"].startswith("method and model effects over 3 curve(s)")
    [point] = law["predictions"]
    assert point["value"] == pytest.approx(100.0 * math.exp(expected * features[new][1]), rel=1e-9)


def test_magnitude_curves_read_no_calibration_and_take_any_profile_of_their_model(
    api: TestClient, start_worker: Any, tiny_model_dir: Path
) -> None:
    worker = start_worker()
    model = str(tiny_model_dir)
    profile = profile_body(model, sparsities=[0.25, 0.5], lens_tokens=0)
    wait_done(api, api.post("/v1/jobs", json=profile).json()["id"], worker)
    sweep = sweep_body(model, [0.25, 0.5], method="magnitude")
    wait_done(api, api.post("/v1/jobs", json=sweep).json()["id"], worker)

    backtests = api.get("/v1/backtests", params={"method": "magnitude"})
    assert backtests.status_code == 200, backtests.text
    [curve] = backtests.json()["curves"]
    assert "/ no calibration /" in curve["label"] and set(curve["features"]) == MASK_FEATURES
    body = prediction_body(model, "magnitude")
    [metric] = api.post("/v1/predictions", json=body).json()["metrics"]
    assert metric["before_pruning"]["own_points"] == 2 and metric["before_pruning"]["mode"] == "one-point"
