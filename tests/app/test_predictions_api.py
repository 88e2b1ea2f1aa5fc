"""POST /v1/predictions and GET /v1/models/{model}/curves on Postgres: calibrated and strict laws,
the store's points with their ids, missing baselines (409 / 202), validation, curves and plots."""

from __future__ import annotations

import math
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select, text

from core.store import Store
from core.tables import Result
from tests.app.store_points import OPT_125M_DENSE, OPT_125M_SLICED, add_series, ppl_protocol
from tests.app.test_jobs_api import assert_problem
from tests.conftest import REPO_ROOT

OPT = "facebook/opt-125m"


def caller_points(dense: float, pruned: dict[float, float], metric: str = "ppl", **extra: Any) -> list[Any]:
    points = [{"metric": metric, "sparsity": 0.0, "value": dense, **extra}]
    points += [{"metric": metric, "sparsity": s, "value": v, **extra} for s, v in pruned.items()]
    return points


def predict(api: TestClient, **body: Any) -> dict[str, Any]:
    response = api.post("/v1/predictions", json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def test_published_opt125m_points_calibrate_25_and_30_percent_within_10_percent_and_flag_the_strict_law(
    api: TestClient,
) -> None:
    calibration = {s: OPT_125M_SLICED[s] for s in (0.10, 0.20)}
    answer = predict(
        api, model=OPT, sparsities=[0.25, 0.30], points=caller_points(OPT_125M_DENSE, calibration)
    )
    ppl = answer["metrics"][0]
    assert ppl["source"] == "caller" and ppl["baseline"]["value"] == OPT_125M_DENSE
    assert [p["sparsity"] for p in ppl["fitted_on"]] == [0.10, 0.20]
    for p in ppl["predictions"]:
        measured = OPT_125M_SLICED[p["sparsity"]]
        assert abs(p["value"] / measured - 1) < 0.10, p
        assert p["law"] == ppl["calibration"]["law"] != "strict"
        lo, hi = p["band"]
        assert lo < p["value"] < hi and p["expected_rel_error"] > 0
        assert p["strict"] > 2 * p["value"]  # the strict law beside it: 83.6 at 25 %
    strict = ppl["strict_law"]
    assert strict["max_abs_rel_error"] > 0.5
    assert [e["sparsity"] for e in strict["errors"]] == [0.10, 0.20]
    assert "strict_law_off" in ppl["flags"]
    assert any("strict law is off by" in note and "+84%" in note for note in ppl["notes"])


def test_stored_dense_and_pruned_results_predict_with_their_result_ids(
    api: TestClient, clean_store: Store
) -> None:
    ids = add_series(clean_store, OPT, OPT_125M_DENSE, [(0.1, 29.33), (0.2, 34.53), (0.3, 44.61)])
    answer = predict(api, model=OPT, sparsities=[0.25])
    ppl = answer["metrics"][0]
    assert ppl["source"] == "store"
    assert ppl["baseline"] == {"sparsity": 0.0, "value": OPT_125M_DENSE, "result_id": ids[0]}
    assert [p["result_id"] for p in ppl["fitted_on"]] == ids[1:]
    assert ppl["protocol"]["seqlen"] == 2048 and ppl["protocol"]["max_windows"] == 4
    assert ppl["calibration"]["loo_rel_error"] is not None  # three sparsities: cross-validated
    (p,) = ppl["predictions"]
    assert abs(p["value"] / OPT_125M_SLICED[0.25] - 1) < 0.05
    assert "extrapolated" not in p["flags"]


def test_a_method_other_than_slicing_is_flagged_where_the_strict_law_does_not_apply(
    api: TestClient, clean_store: Store
) -> None:
    add_series(clean_store, OPT, OPT_125M_DENSE, [(0.5, 40.0)], method="wanda")
    ppl = predict(api, model=OPT, method="wanda", sparsities=[0.4])["metrics"][0]
    assert "strict_law_not_for_method" in ppl["flags"]
    assert any("the strict law is a slicing law" in note for note in ppl["notes"])
    sliced = predict(api, model=OPT, sparsities=[0.4])["metrics"][0]  # the same dense baseline
    assert "strict_law_not_for_method" not in sliced["flags"]


def test_a_dense_only_store_has_no_answer_but_names_the_job_that_would_give_one(
    api: TestClient, clean_store: Store
) -> None:
    """The strict law is shown, never the answer: nothing earned it. The simulate job is named."""
    add_series(clean_store, OPT, OPT_125M_DENSE, [])
    ppl = predict(api, model=OPT, sparsities=[0.25])["metrics"][0]
    (p,) = ppl["predictions"]
    assert p["value"] is None and p["rung"] is None and "no_answer" in p["flags"]
    rungs = {a["rung"]: a for a in p["alternatives"]}
    assert list(rungs) == ["measured", "simulated", "profile", "law", "strict"]
    assert rungs["strict"]["value"] == pytest.approx(83.57, abs=0.01) and rungs["strict"]["band"] is None
    assert "simulate" in rungs["simulated"]["why_not"] and "profile" in rungs["profile"]["why_not"]
    assert ppl["calibration"] is None and "strict_only" in ppl["flags"]
    assert "cannot be checked" in ppl["strict_law"]["verdict"]
    (missing,) = ppl["missing"]
    assert missing["kind"] == "simulate" and missing["job"]["sparsities"] == [0.25]
    asked = predict(api, model=OPT, sparsities=[0.25], rung="strict")["metrics"][0]["predictions"][0]
    assert asked["rung"] == "strict" and asked["value"] == pytest.approx(83.57, abs=0.01)


def test_protocol_is_the_exact_match_when_given_else_the_one_with_most_points(
    api: TestClient, clean_store: Store
) -> None:
    add_series(clean_store, OPT, 27.0, [(0.1, 29.0), (0.2, 34.0)], protocol=ppl_protocol(max_windows=4))
    add_series(clean_store, OPT, 25.0, [(0.2, 31.0)], protocol=ppl_protocol(max_windows=None))
    common = predict(api, model=OPT, sparsities=[0.25])["metrics"][0]
    assert common["baseline"]["value"] == 27.0 and common["protocol"]["max_windows"] == 4
    assert "most points" in common["protocol"]["selection"]
    assert any("other protocols" in note for note in common["notes"])
    exact = predict(api, model=OPT, sparsities=[0.25], protocol={"seqlen": 2048, "max_windows": "all"})
    chosen = exact["metrics"][0]
    assert chosen["baseline"]["value"] == 25.0 and chosen["protocol"]["max_windows"] is None
    assert chosen["protocol"]["selection"].startswith("exact match")


def test_newest_result_per_sparsity_is_used(api: TestClient, clean_store: Store) -> None:
    add_series(clean_store, OPT, 27.0, [(0.2, 40.0)])
    newer = add_series(clean_store, OPT, None, [(0.2, 34.0)])
    ppl = predict(api, model=OPT, sparsities=[0.2])["metrics"][0]
    assert [p["result_id"] for p in ppl["fitted_on"]] == newer


def test_unknown_baseline_is_409_naming_the_simulate_job_and_active_jobs(
    api: TestClient, tiny_model_dir: Path
) -> None:
    model = str(tiny_model_dir.resolve())
    body = {"model": model, "sparsities": [0.2], "protocol": {"seqlen": 64, "max_windows": 2}}
    problem = assert_problem(api.post("/v1/predictions", json=body), 409)
    assert problem["type"].endswith("/baseline-missing") and "measure_missing" in problem["detail"]
    job = problem["job"]  # slicing has a simulation: one job measures the baseline and the curve
    assert job["kind"] == "simulate" and job["model"] == model and job["sparsities"] == [0.2]
    assert job["perplexity"]["seqlen"] == 64 and job["perplexity"]["max_windows"] == 2
    assert problem["active_jobs"] == []
    submitted = api.post("/v1/jobs", json=job)
    assert submitted.status_code == 202, submitted.text
    again = assert_problem(api.post("/v1/predictions", json=body), 409)
    assert [(j["id"], j["supplies"]) for j in again["active_jobs"]] == [(submitted.json()["id"], True)]


def test_the_evaluate_job_for_a_missing_baseline_measures_in_the_dtype_asked_for(
    api: TestClient, tiny_model_dir: Path
) -> None:
    # Without it the job would run with dtype "auto" and never store the baseline asked for.
    body = {"model": str(tiny_model_dir.resolve()), "sparsities": [0.2], "protocol": {"dtype": "float16"}}
    job = assert_problem(api.post("/v1/predictions", json=body), 409)["job"]
    assert job["dtype"] == "float16"
    dropped = {**body, "method": "shortgpt"}  # no simulation: an evaluate job measures the baseline
    job = assert_problem(api.post("/v1/predictions", json=dropped), 409)["job"]
    assert job["kind"] == "evaluate" and job["dtype"] == "float16"


def test_measure_missing_queues_the_simulate_job_once_and_answers_202(
    api: TestClient, tiny_model_dir: Path
) -> None:
    body = {
        "model": str(tiny_model_dir.resolve()),
        "sparsities": [0.2],
        "protocol": {"seqlen": 64, "max_windows": 2},
        "measure_missing": True,
    }
    response = api.post("/v1/predictions", json=body)
    assert response.status_code == 202, response.text
    queued = response.json()
    job = queued["job"]
    assert response.headers["location"] == f"/v1/jobs/{job['id']}"
    assert job["kind"] == "simulate" and job["status"] == "queued"
    assert job["request"]["perplexity"]["max_windows"] == 2
    assert queued["retry"]["wait"] == f"/v1/jobs/{job['id']}/wait"
    assert api.get(f"/v1/jobs/{job['id']}").json()["status"] == "queued"
    repeat = api.post("/v1/predictions", json=body)
    assert repeat.status_code == 202 and repeat.json()["job"]["id"] == job["id"]
    assert len(api.get("/v1/jobs", params={"kind": "simulate"}).json()["items"]) == 1


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"sparsities": [1.0]}, "sparsities"),
        ({"sparsities": [1.5]}, "sparsities"),
        ({"sparsities": [-0.1]}, "sparsities"),
        ({"sparsities": []}, "sparsities"),
        ({"sparsities": [0.1] * 101}, "sparsities"),
        ({"metrics": [{"metric": "bleu"}]}, "metric"),
        ({"metrics": [{"metric": "acc"}]}, "metrics"),
        ({"metrics": [{"metric": "ppl", "task": "arc_easy"}]}, "metrics"),
        ({"protocol": {"max_windows": 0}}, "protocol"),
        ({"method": "dense"}, "method"),
        ({"level": 1.0}, "level"),
        ({"sparsity": 0.2}, "sparsity"),
    ],
)
def test_invalid_requests_are_422_naming_the_field(
    api: TestClient, change: dict[str, Any], field: str
) -> None:
    body = {"model": OPT, "sparsities": [0.25], **change}
    problem = assert_problem(api.post("/v1/predictions", json=body), 422)
    assert field in problem["detail"]


@pytest.mark.parametrize(
    ("points", "fragment"),
    [
        ([{"metric": "ppl", "sparsity": 0.1, "value": 29.0}], "no dense value"),
        (
            [
                {"metric": "ppl", "sparsity": 0.0, "value": 0.9},
                {"metric": "ppl", "sparsity": 0.1, "value": 2},
            ],
            "> 1",
        ),
        (caller_points(20.0, {}) * 2, "dense values"),
        ([{"metric": "acc", "task": "arc_easy", "sparsity": 0.0, "value": 0.5}], "does not ask for"),
    ],
)
def test_unusable_points_are_422(api: TestClient, points: list[Any], fragment: str) -> None:
    body = {"model": OPT, "sparsities": [0.25], "points": points}
    problem = assert_problem(api.post("/v1/predictions", json=body), 422)
    assert fragment in problem["detail"]


def test_diverging_laws_answer_null_with_a_flag_not_an_error(api: TestClient) -> None:
    answer = predict(api, model=OPT, sparsities=[0.5, 0.999], points=caller_points(1e6, {}), rung="strict")
    p_half, p_edge = answer["metrics"][0]["predictions"]
    assert p_half["value"] == pytest.approx(1e12, rel=1e-9) and p_half["rung"] == "strict"
    assert p_edge["value"] is None and "non_finite" in p_edge["flags"]
    steep = predict(api, model=OPT, sparsities=[0.9], points=caller_points(20.0, {0.1: 200.0, 0.2: 5000.0}))
    (p,) = steep["metrics"][0]["predictions"]
    assert p["value"] is None or math.isfinite(p["value"])
    assert p["value"] is not None or "non_finite" in p["flags"]


def test_accuracy_from_the_store_is_clipped_at_the_recorded_chance(
    api: TestClient, clean_store: Store
) -> None:
    ids = add_series(
        clean_store,
        OPT,
        0.60,
        [(0.2, 0.45), (0.3, 0.38)],
        metric="acc",
        dataset="arc_easy",
        protocol={"chance": 0.25, "num_fewshot": 0},
    )
    answer = predict(api, model=OPT, sparsities=[0.25, 0.95], metrics=[{"metric": "acc", "task": "arc_easy"}])
    acc = answer["metrics"][0]
    assert acc["task"] == "arc_easy" and acc["protocol"]["chance"] == 0.25
    assert [p["result_id"] for p in acc["fitted_on"]] == ids[1:] and acc["strict_law"] is None
    mid, far = acc["predictions"]
    assert 0.38 < mid["value"] < 0.45
    assert far["value"] == 0.25 and "clipped_at_chance" in far["flags"]


def test_accuracy_without_pruned_points_uses_a_prior_pooled_over_the_store(
    api: TestClient, clean_store: Store
) -> None:
    add_series(clean_store, "other/model", 0.70, [(0.3, 0.60)], metric="acc", dataset="piqa")
    points = [{"metric": "acc", "task": "arc_easy", "sparsity": 0.0, "value": 0.6, "n_options": 4}]
    answer = predict(
        api,
        model=OPT,
        sparsities=[0.3],
        metrics=[{"metric": "acc", "task": "arc_easy"}],
        points=points,
    )
    acc = answer["metrics"][0]
    assert "prior" in acc["flags"] and acc["calibration"]["law"] == "prior"
    (p,) = acc["predictions"]
    expected_k = -math.log(0.60 / 0.70) / 0.3
    assert p["value"] == pytest.approx(0.6 * math.exp(-expected_k * 0.3), rel=1e-6)
    assert any("pooled over 1 fitted slopes" in note and "other/model/piqa" in note for note in acc["notes"])


def test_ppl_and_accuracy_in_one_request(api: TestClient) -> None:
    points = caller_points(20.0, {0.2: 25.0}) + caller_points(
        0.6, {0.2: 0.55}, metric="acc_norm", task="hellaswag", chance=0.25
    )
    metrics = [{"metric": "ppl"}, {"metric": "acc_norm", "task": "hellaswag"}]
    answer = predict(api, model=OPT, sparsities=[0.1, 0.3], metrics=metrics, points=points)
    assert [(m["metric"], m["task"]) for m in answer["metrics"]] == [("ppl", None), ("acc_norm", "hellaswag")]
    assert all(len(m["predictions"]) == 2 for m in answer["metrics"])


# -------------------------------------------------------------------------------------------- curves


def test_curve_json_has_measured_points_both_laws_and_a_band(api: TestClient, clean_store: Store) -> None:
    add_series(clean_store, OPT, OPT_125M_DENSE, [(0.1, 29.33), (0.2, 34.53)])
    response = api.get(f"/v1/models/{OPT}/curves", params={"metric": "ppl", "method": "slicegpt"})
    assert response.status_code == 200, response.text
    curve = response.json()
    assert curve["model"] == OPT and curve["metric"] == "ppl"
    assert [p["sparsity"] for p in curve["measured"]] == [0.0, 0.1, 0.2]
    grid = [p["sparsity"] for p in curve["calibrated"]]
    assert grid[0] == 0.0 and grid[-1] == 0.9 and grid == [p["sparsity"] for p in curve["strict"]]
    assert curve["strict"][0]["value"] == pytest.approx(OPT_125M_DENSE)
    at_25 = next(p for p in curve["calibrated"] if p["sparsity"] == 0.25)
    assert at_25["low"] < at_25["value"] < at_25["high"]
    assert curve["calibration"]["law"] in ("alpha", "affine")


def test_a_curve_draws_the_answer_a_prediction_gives_with_its_rung(
    api: TestClient, clean_store: Store
) -> None:
    add_series(clean_store, OPT, OPT_125M_DENSE, [(0.1, 29.33), (0.2, 34.53)])
    curve = api.get(f"/v1/models/{OPT}/curves", params={"metric": "ppl", "method": "slicegpt"}).json()
    answer = {p["sparsity"]: p for p in curve["answer"]}
    assert answer[0.1]["rung"] == "measured" and answer[0.1]["value"] == pytest.approx(29.33)
    body = {"model": OPT, "method": "slicegpt", "sparsities": [0.25, 0.5]}
    predicted = api.post("/v1/predictions", json=body).json()["metrics"][0]["predictions"]
    for point in predicted:  # the very number a user is told, band and rung included
        drawn = answer[point["sparsity"]]
        assert (drawn["value"], [drawn["low"], drawn["high"]], drawn["rung"]) == (
            point["value"],
            point["band"],
            point["rung"],
        )
    svg = api.get(f"/v1/models/{OPT}/curves", params={"metric": "ppl", "format": "svg"}).text
    assert "the answer (law, measured)" in svg  # its rungs, in the order the grid meets them


def test_a_drawn_affine_law_passes_through_the_dense_value_it_was_fitted_with(
    api: TestClient, clean_store: Store
) -> None:
    """ln PPL0 / ln PPL = a + b (1 - s) with a + b = 0.95: at s = 0 the law says 36, not 30. The
    curve draws what the law rung answers: 30 at s = 0, ln PPL interpolated up to the first point."""
    ppl0, a, b = 30.0, 0.45, 0.5
    add_series(
        clean_store, OPT, ppl0, [(s, ppl0 ** (1 / (a + b * (1 - s)))) for s in (0.1, 0.2, 0.3, 0.4, 0.5)]
    )
    curve = api.get(f"/v1/models/{OPT}/curves", params={"metric": "ppl", "method": "slicegpt"}).json()
    assert curve["calibration"]["law"] == "affine"
    drawn = {p["sparsity"]: p["value"] for p in curve["calibrated"]}
    at_first = ppl0 ** (1 / 0.9)
    assert drawn[0.0] == pytest.approx(ppl0) and drawn[0.1] == pytest.approx(at_first)
    assert drawn[0.05] == pytest.approx(ppl0 * (at_first / ppl0) ** 0.5)
    assert "interpolated_from_dense" in curve["flags"] and "drawn_from_first_point" not in curve["flags"]
    assert any("not anchored at the dense point" in note for note in curve["notes"])
    svg = api.get(f"/v1/models/{OPT}/curves", params={"metric": "ppl", "format": "svg"})
    assert svg.status_code == 200


def test_an_affine_law_answers_short_of_its_first_point_from_the_dense_value(
    api: TestClient, clean_store: Store
) -> None:
    """Its free intercept puts the law at 36 at s = 0 where the dense model measures 30 (and it can
    fall below 30): short of the first fitted point the answer is ln PPL interpolated from dense."""
    ppl0, a, b = 30.0, 0.45, 0.5
    add_series(
        clean_store, OPT, ppl0, [(s, ppl0 ** (1 / (a + b * (1 - s)))) for s in (0.1, 0.2, 0.3, 0.4, 0.5)]
    )
    body = {"model": OPT, "method": "slicegpt", "sparsities": [0.05, 0.1, 0.15]}
    [at_05, at_10, at_15] = api.post("/v1/predictions", json=body).json()["metrics"][0]["predictions"]
    assert at_10["rung"] == "measured" and at_05["rung"] == "law"
    law = next(e for e in at_10["alternatives"] if e["rung"] == "law")["value"]
    assert at_05["value"] == pytest.approx(ppl0 * (law / ppl0) ** 0.5)
    assert ppl0 < at_05["value"] < at_10["value"] and "interpolated_from_dense" in at_05["flags"]
    assert "interpolated_from_dense" not in at_15["flags"]


def test_curve_svg_parses_as_xml_and_png_has_the_png_signature(api: TestClient, clean_store: Store) -> None:
    add_series(clean_store, OPT, OPT_125M_DENSE, [(0.1, 29.33), (0.2, 34.53)])
    svg = api.get(f"/v1/models/{OPT}/curves", params={"format": "svg"})
    assert svg.status_code == 200 and svg.headers["content-type"].startswith("image/svg+xml")
    root = ET.fromstring(svg.content)
    assert root.tag.endswith("svg")
    assert OPT in svg.text and "strict law" in svg.text
    png = api.get(f"/v1/models/{OPT}/curves", params={"format": "png"})
    assert png.status_code == 200 and png.headers["content-type"] == "image/png"
    assert png.content[:8] == b"\x89PNG\r\n\x1a\n" and len(png.content) > 10_000


def test_accuracy_curve_renders_with_its_chance_line(api: TestClient, clean_store: Store) -> None:
    add_series(
        clean_store, OPT, 0.6, [(0.3, 0.45)], metric="acc", dataset="arc_easy", protocol={"chance": 0.25}
    )
    params = {"metric": "acc", "task": "arc_easy", "format": "svg"}
    svg = api.get(f"/v1/models/{OPT}/curves", params=params)
    assert svg.status_code == 200, svg.text
    assert "chance" in svg.text
    curve = api.get(f"/v1/models/{OPT}/curves", params={"metric": "acc", "task": "arc_easy"}).json()
    assert curve["strict"] is None and min(p["low"] for p in curve["calibrated"]) >= 0.25


def test_curve_without_a_baseline_is_404_and_a_task_for_ppl_is_422(api: TestClient) -> None:
    problem = assert_problem(api.get("/v1/models/nobody/never/curves"), 404)
    assert problem["type"].endswith("/baseline-missing")
    assert_problem(api.get(f"/v1/models/{OPT}/curves", params={"task": "arc_easy"}), 422)
    assert_problem(api.get(f"/v1/models/{OPT}/curves", params={"max_windows": "lots"}), 422)


# ----------------------------------------------------------------------------------- store and start


def test_store_read_retries_once_on_a_connection_the_server_dropped(clean_store: Store) -> None:
    count = select(func.count()).select_from(Result)
    assert clean_store.read(count)[0][0] == 0  # the reader's pool now holds a connection
    with clean_store.engine.connect() as connection:
        killed = connection.execute(
            text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        ).scalar_one()
    assert killed >= 1
    assert clean_store.read(count)[0][0] == 0


def test_api_start_imports_no_matplotlib() -> None:
    script = "import sys, app.main\napp.main.create_app\nprint('matplotlib' in sys.modules)\n"
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "False"


def test_a_caller_point_at_a_vanishing_sparsity_is_a_422_naming_it(api: TestClient) -> None:
    body = {"model": "m", "sparsities": [0.3], "points": caller_points(20.0, {1e-300: 20.5, 0.2: 30.0})}
    problem = assert_problem(api.post("/v1/predictions", json=body), 422)
    assert "sparsity 1e-300 is neither 0 (the dense baseline) nor at least 1e-06" in problem["detail"]


def test_two_caller_values_at_one_sparsity_are_a_422_naming_it(api: TestClient) -> None:
    points = [*caller_points(20.0, {0.2: 30.0}), {"metric": "ppl", "sparsity": 0.2, "value": 40.0}]
    problem = assert_problem(
        api.post("/v1/predictions", json={"model": "m", "sparsities": [0.3], "points": points}), 422
    )
    assert "several values at sparsity 0.2 for ppl" in problem["detail"]
