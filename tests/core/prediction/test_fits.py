"""Fits of the laws as store rows (core.prediction.fits), from synthetic points without a worker, and the
/v1/fits endpoint over rows in the store."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pytest
from fastapi.testclient import TestClient

from core.prediction import laws
from core.prediction.fits import FitError, MeasuredPoint, accuracy_fit, n_options_from, ppl_fit
from core.store import Store
from core.tables import Fit, Job
from tests.app.test_jobs_api import assert_problem

PPL0 = 20.0
PROTOCOL = {"seqlen": 512, "max_windows": 4, "data_sha256": "a" * 64, "dtype": "float32"}


def alpha_law(alpha: float, s: float) -> float:
    """ln PPL0 / ln PPL = 1 - alpha * s, solved for PPL."""
    return math.exp(math.log(PPL0) / (1.0 - alpha * s))


def build(points: list[MeasuredPoint], **overrides: Any) -> Fit:
    fields: dict[str, Any] = {
        "model_id": "m",
        "model_revision": "r1",
        "method": "slicegpt",
        "dataset": "wikitext2",
        "protocol": PROTOCOL,
        "dense": MeasuredPoint(0.0, PPL0, 1),
        "points": points,
        "job_id": "job-1",
        **overrides,
    }
    return ppl_fit(**fields)


def test_fit_row_recovers_the_law_of_noisy_synthetic_points_and_rates_every_law() -> None:
    rng = random.Random(7)
    sparsities = [0.1, 0.2, 0.3, 0.4]
    points = [
        MeasuredPoint(s, alpha_law(1.3, s) * (1.0 + rng.gauss(0.0, 0.005)), 10 + i)
        for i, s in enumerate(sparsities)
    ]
    row = build(list(reversed(points)))  # any order in, sorted by sparsity out

    assert row.metric == "ppl" and row.job_id == "job-1" and row.model_revision == "r1"
    assert row.law == "alpha" and row.formula == "ln PPL0 / ln PPL = 1 - alpha * s"
    assert row.params["alpha"] == pytest.approx(1.3, rel=0.02)
    assert row.baseline == PPL0 and row.protocol == PROTOCOL
    assert row.points == [
        {"sparsity": 0.0, "value": PPL0, "result_id": 1, "used": True},
        *({"sparsity": p.sparsity, "value": p.value, "result_id": p.result_id, "used": True} for p in points),
    ]
    assert set(row.quality) == {"alpha", "affine", "strict"}
    alpha, affine, strict = row.quality["alpha"], row.quality["affine"], row.quality["strict"]
    for quality in (alpha, affine, strict):
        assert quality["n"] == 4 and set(quality) >= {"r2", "max_ape", "mean_ape", "formula", "params"}
    assert alpha["max_ape"] < 0.02 and alpha["r2"] > 0.99 and alpha["loo_rel_error"] < 0.02
    assert affine["params"].keys() == {"a", "b"} and affine["loo_rel_error"] is not None
    # The strict law (alpha = 1) under-predicts these points: it is rated, and rated worse.
    assert strict["max_ape"] > 0.1 and strict["mean_ape"] > alpha["mean_ape"]
    assert strict["params"] == {"ppl0": PPL0} and strict["loo_rel_error"] is None
    assert "leave-one-out" in row.chosen_reason
    json.dumps({"points": row.points, "quality": row.quality}, allow_nan=False)  # no inf or NaN


def test_fit_row_matches_what_the_laws_module_computes() -> None:
    points = [MeasuredPoint(0.1, 29.0), MeasuredPoint(0.2, 34.5), MeasuredPoint(0.3, 44.6)]
    row = build(points, dense=MeasuredPoint(0.0, 27.64))
    calibration = laws.calibrate_ppl(27.64, [(p.sparsity, p.value) for p in points])
    assert row.law == calibration.chosen.law and row.chosen_reason == calibration.reason
    assert row.params == pytest.approx(calibration.chosen.params)
    for law, quality in calibration.quality.items():
        assert row.quality[law]["max_ape"] == pytest.approx(quality.max_ape)
        assert row.quality[law]["mean_ape"] == pytest.approx(quality.mean_ape)


def test_one_pruned_point_fits_the_one_parameter_law_and_says_why() -> None:
    row = build([MeasuredPoint(0.25, alpha_law(1.2, 0.25), 5)])
    assert row.law == "alpha" and set(row.quality) == {"alpha", "strict"}
    assert row.params["alpha"] == pytest.approx(1.2)
    assert row.quality["alpha"]["r2"] is None and row.quality["alpha"]["band_from_prior"] is True
    assert "one pruned sparsity" in row.chosen_reason


def test_collapsed_points_are_kept_but_left_out_of_the_fit() -> None:
    points = [MeasuredPoint(0.1, alpha_law(1.3, 0.1), 2), MeasuredPoint(0.9, math.inf, 3)]
    row = build(points)
    assert row.points[-1] == {"sparsity": 0.9, "value": None, "result_id": 3, "used": False}
    assert row.quality["alpha"]["n"] == 1
    json.dumps(row.points, allow_nan=False)


@pytest.mark.parametrize(
    ("dense", "points", "fragment"),
    [
        (MeasuredPoint(0.0, PPL0), [], "no pruned point"),
        (MeasuredPoint(0.0, PPL0), [MeasuredPoint(0.3, math.nan)], "no pruned point"),
        (MeasuredPoint(0.0, PPL0), [MeasuredPoint(0.0, PPL0)], "no pruned point"),
        (MeasuredPoint(0.0, 1.0), [MeasuredPoint(0.3, 30.0)], "dense perplexity"),
        (MeasuredPoint(0.1, PPL0), [MeasuredPoint(0.3, 30.0)], "sparsity 0"),
    ],
)
def test_unfittable_points_raise_a_fit_error_that_says_why(
    dense: MeasuredPoint, points: list[MeasuredPoint], fragment: str
) -> None:
    with pytest.raises(FitError, match=fragment):
        build(points, dense=dense)


def add_fits(store: Store, count: int, **fields: Any) -> list[int]:
    with store.session() as session:
        if session.get(Job, "job-1") is None:
            session.add(Job(id="job-1", kind="sweep", request={}, model_id="m", request_hash="h"))
            session.flush()
        rows = [build([MeasuredPoint(0.2, alpha_law(1.1, 0.2), None)], **fields) for _ in range(count)]
        session.add_all(rows)
        session.flush()
        return [row.id for row in rows]


def test_fits_are_listed_newest_first_with_filters_and_cursor_pages(
    api: TestClient, clean_store: Store
) -> None:
    ids = add_fits(clean_store, 3)
    other = add_fits(clean_store, 1, model_id="other", method="wanda")

    everything = api.get("/v1/fits").json()
    assert [item["id"] for item in everything["items"]] == [*other, *reversed(ids)]
    first = api.get("/v1/fits", params={"model": "m", "limit": 2}).json()
    assert [item["id"] for item in first["items"]] == [ids[2], ids[1]] and first["next_cursor"]
    second = api.get("/v1/fits", params={"model": "m", "limit": 2, "cursor": first["next_cursor"]}).json()
    assert [item["id"] for item in second["items"]] == [ids[0]] and second["next_cursor"] is None
    assert [item["id"] for item in api.get("/v1/fits", params={"method": "wanda"}).json()["items"]] == other
    assert api.get("/v1/fits", params={"metric": "acc"}).json()["items"] == []
    assert len(api.get("/v1/fits", params={"job_id": "job-1"}).json()["items"]) == 4

    one = api.get(f"/v1/fits/{ids[0]}").json()
    assert one["model"] == "m" and one["law"] == "alpha" and one["baseline"] == PPL0
    assert one["points"][0] == {"sparsity": 0.0, "value": PPL0, "result_id": 1, "used": True}
    assert set(one["quality"]) == {"alpha", "strict"} and one["quality"]["alpha"]["max_ape"] < 1e-9
    assert_problem(api.get("/v1/fits/999999"), 404)


def test_fits_are_documented_in_openapi(api: TestClient) -> None:
    spec = api.get("/openapi.json").json()
    assert "/v1/fits" in spec["paths"] and "/v1/fits/{fit_id}" in spec["paths"]
    assert any(tag["name"] == "fits" for tag in spec["tags"])
    quality = spec["components"]["schemas"]["LawQualityPublic"]["properties"]
    assert {"r2", "max_ape", "mean_ape", "loo_rel_error"} <= set(quality)


def test_accuracy_fit_recovers_the_slope_of_synthetic_points_and_leaves_out_unusable_ones() -> None:
    acc0, k = 0.8, 0.9
    sparsities = [0.1, 0.2, 0.3, 0.4]
    points = [MeasuredPoint(s, acc0 * math.exp(-k * s), 10 + i) for i, s in enumerate(sparsities)]
    below_chance, zero = MeasuredPoint(0.7, 0.2, 20), MeasuredPoint(0.8, 0.0, 21)
    row = accuracy_fit(
        model_id="m",
        model_revision="r1",
        method="slicegpt",
        metric="acc_norm",
        task="arc_easy",
        n_options=4,
        protocol={"limit": 100},
        dense=MeasuredPoint(0.0, acc0, 1),
        points=[zero, below_chance, *reversed(points)],
        job_id="job-1",
    )
    assert row.metric == "acc_norm" and row.dataset == "arc_easy" and row.baseline == acc0
    assert row.protocol == {"limit": 100, "n_options": 4}
    assert row.law == "slope" and row.params["k"] == pytest.approx(k, rel=1e-6) and row.chosen_reason
    assert "left out 1 point(s) at or below chance" in row.chosen_reason
    assert set(row.quality) == {"slope", "affine"}
    assert row.quality["slope"]["n"] == 4 and row.quality["slope"]["max_ape"] == pytest.approx(0.0, abs=1e-9)
    assert [(p["sparsity"], p["result_id"], p["used"]) for p in row.points] == [
        (0.0, 1, True),
        *((p.sparsity, p.result_id, True) for p in points),
        (0.7, 20, False),
        (0.8, 21, False),
    ]
    # Nothing above chance: the prior slope, rated on no point.
    prior = accuracy_fit(
        model_id="m",
        model_revision=None,
        method="slicegpt",
        metric="acc",
        task="arc_easy",
        n_options=4,
        protocol={},
        dense=MeasuredPoint(0.0, acc0, 1),
        points=[below_chance],
    )
    assert prior.law == "prior" and prior.quality["prior"]["n"] == 0
    with pytest.raises(FitError, match="nothing to anchor on"):
        accuracy_fit(
            model_id="m",
            model_revision=None,
            method="slicegpt",
            metric="acc",
            task="arc_easy",
            n_options=4,
            protocol={},
            dense=MeasuredPoint(0.0, 0.0, 1),
            points=points,
        )
    assert n_options_from({"chance": 0.26}) == 4 and n_options_from({"n_options": 2, "chance": 0.25}) == 2
    with pytest.raises(FitError):
        n_options_from({})
