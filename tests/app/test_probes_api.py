"""`probe` jobs and the new prune methods at submit time, and GET /v1/jobs/{id}/probes: filters,
keyset pagination and the estimate-versus-value summary over every matching point."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.services.probe_summary import EstimatedPoint, pearson, summarize
from core.store import Store
from core.tables import Artifact
from tests.app.store_points import add_job
from tests.app.store_probes import add_probe_points, counterfactual_points, probe_job
from tests.app.test_jobs_api import assert_problem

UNKNOWN_JOB = "00000000-0000-7000-8000-000000000000"


def probe_body(model: str, **overrides: Any) -> dict[str, Any]:
    return {"kind": "probe", "model": model, "method": "wanda", "sparsity": 0.5, **overrides}


def prune_body(model: str, method: str, sparsity: float = 0.5, **overrides: Any) -> dict[str, Any]:
    return {"kind": "prune", "model": model, "method": method, "sparsity": sparsity, **overrides}


def queued(api: TestClient, job_id: str) -> bool:
    holds: bool = api.app.state.services.queue.holds(job_id)  # type: ignore[attr-defined]
    return holds


def succeeded_prune_with_artifact(store: Store, model: str) -> str:
    job_id = add_job(store, model, kind="prune", method="wanda", sparsity=0.5)
    with store.session() as session:
        session.add(
            Artifact(
                job_id=job_id, kind="pruned-model", path=f"/artifacts/{job_id}", bytes=1, sha256="0" * 64
            )
        )
    return job_id


# ------------------------------------------------------------------------------------ submitting


@pytest.mark.parametrize(
    ("method", "extra"),
    [
        ("magnitude", {}),
        ("wanda", {"pattern": "2:4"}),
        ("sparsegpt", {"pattern": "4:8"}),
        ("attention-drop", {"sparsity": 0.25}),
        ("mlp-drop", {"sparsity": 0.25}),
        ("shortgpt", {"sparsity": 0.25}),
    ],
)
def test_new_prune_methods_are_accepted_and_queued(
    api: TestClient, tiny_model_dir: Path, method: str, extra: dict[str, Any]
) -> None:
    response = api.post("/v1/jobs", json={**prune_body(str(tiny_model_dir), method), **extra})
    assert response.status_code == 202, response.text
    job = response.json()
    assert job["status"] == "queued" and job["request"]["method"] == method
    assert job["request"]["pattern"] == extra.get("pattern", "unstructured")
    assert job["links"]["probes"] == f"/v1/jobs/{job['id']}/probes"
    assert queued(api, job["id"])


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"method": "wanda", "sparsity": 0.3, "pattern": "2:4"}, "sparsity is fixed at 0.5"),
        (
            {"method": "shortgpt", "sparsity": 0.5, "pattern": "2:4"},
            "only applies to magnitude, wanda, sparsegpt",
        ),
        ({"method": "slicegpt", "sparsity": 0.5, "pattern": "4:8"}, "only applies to"),
        ({"method": "wanda", "slice_head": True}, "slice_head is a slicegpt option"),
    ],
)
def test_inconsistent_pruning_options_are_a_422_saying_why(
    api: TestClient, tiny_model_dir: Path, change: dict[str, Any], fragment: str
) -> None:
    bodies = [prune_body(str(tiny_model_dir), "wanda")]
    if "slice_head" not in change:  # probes take no slice_head at all
        bodies.append(probe_body(str(tiny_model_dir)))
    for body in bodies:
        body = assert_problem(api.post("/v1/jobs", json={**body, **change}), 422)
        assert fragment in body["detail"], body
        assert body["type"].endswith("/validation-error")
    assert api.get("/v1/jobs").json()["items"] == []


def test_dropping_every_layer_is_refused_at_submit(api: TestClient, tiny_model_dir: Path) -> None:
    # The tiny Llama has 2 layers: round(0.9 * 2) = 2 removes them all.
    body = assert_problem(api.post("/v1/jobs", json=prune_body(str(tiny_model_dir), "shortgpt", 0.9)), 422)
    assert body["type"].endswith("/invalid-sparsity") and "every block" in body["detail"]


def test_non_causal_models_are_refused_for_the_new_methods(api: TestClient, model_root: Path) -> None:
    folder = model_root / "encoder-only"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(
        json.dumps({"model_type": "bert", "architectures": ["BertForMaskedLM"]})
    )
    for body in (prune_body(str(folder), "magnitude"), probe_body(str(folder))):
        problem = assert_problem(api.post("/v1/jobs", json=body), 422)
        assert problem["type"].endswith("/unsupported-architecture")
        assert "not a causal language model" in problem["detail"]


@pytest.mark.parametrize("given", ["neither", "both"])
def test_probe_needs_exactly_one_of_method_and_artifact_job_id(
    api: TestClient, tiny_model_dir: Path, given: str
) -> None:
    body: dict[str, Any] = {"kind": "probe", "model": str(tiny_model_dir)}
    if given == "both":
        body.update(method="magnitude", sparsity=0.5, artifact_job_id=UNKNOWN_JOB)
    problem = assert_problem(api.post("/v1/jobs", json=body), 422)
    assert "`method`" in problem["detail"] and "`artifact_job_id`" in problem["detail"]
    assert f"got {given}" in problem["detail"]


def test_probe_method_needs_a_sparsity(api: TestClient, tiny_model_dir: Path) -> None:
    problem = assert_problem(
        api.post("/v1/jobs", json={"kind": "probe", "model": str(tiny_model_dir), "method": "wanda"}), 422
    )
    assert "`sparsity` is required" in problem["detail"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"temperature": 0}, "temperature"),
        ({"temperature": 101}, "temperature"),
        ({"sublayers": []}, "sublayers"),
        ({"convention": "paper"}, "convention"),
        ({"sublayers": ["mlp", "mlp"]}, "sublayers"),
        ({"sublayers": ["head"]}, "sublayers"),
        ({"prompts": [{"text": ""}]}, "text"),
        ({"prompts": [{"text": "x" * 4001}]}, "text"),
        ({"prompts": [{"text": "Q?", "options": ["A"]}]}, "options"),
        ({"prompts": [{"text": "Q?", "options": ["A", "B" * 33]}]}, "options"),
        ({"prompts": [{"text": "Q?"}] * 65}, "prompts"),
        ({"generation": {"max_new_tokens": 0}}, "max_new_tokens"),
        ({"generation": {"max_new_tokens": 257}}, "max_new_tokens"),
        ({"artifact_job_id": "not-a-uuid", "method": None, "sparsity": None}, "artifact_job_id"),
    ],
)
def test_invalid_probe_options_are_a_422_naming_the_field(
    api: TestClient, tiny_model_dir: Path, change: dict[str, Any], field: str
) -> None:
    problem = assert_problem(api.post("/v1/jobs", json={**probe_body(str(tiny_model_dir)), **change}), 422)
    assert any(field in error["loc"] for error in problem["errors"]), problem


def test_probe_with_its_own_pruning_is_queued_with_defaults_spelled_out(
    api: TestClient, tiny_model_dir: Path
) -> None:
    prompts = [{"text": "2 + 2 =", "options": None}, {"text": "Pick one:", "options": ["A", "B", "C", "D"]}]
    body = probe_body(str(tiny_model_dir), pattern="2:4", prompts=prompts, generation={"seed": 7})
    response = api.post("/v1/jobs", json=body)
    assert response.status_code == 202, response.text
    job = response.json()
    assert job["kind"] == "probe" and queued(api, job["id"])
    request = job["request"]
    assert request["sublayers"] == ["attention", "mlp", "block"] and request["temperature"] == 1.0
    assert request["generation"] == {"max_new_tokens": 32, "counterfactual_steps": 0, "seed": 7}
    assert request["prompts"] == prompts and request["artifact_job_id"] is None
    defaults = api.post("/v1/jobs", json=probe_body(str(tiny_model_dir), generation=None)).json()
    assert defaults["request"]["generation"] is None and defaults["request"]["prompts"] is None


def test_probe_of_a_succeeded_prune_artifact_is_queued(
    api: TestClient, clean_store: Store, tiny_model_dir: Path
) -> None:
    model = str(tiny_model_dir.resolve())
    source = succeeded_prune_with_artifact(clean_store, model)
    body = {"kind": "probe", "model": str(tiny_model_dir), "artifact_job_id": source}
    response = api.post("/v1/jobs", json=body)
    assert response.status_code == 202, response.text
    assert queued(api, response.json()["id"])
    # Pruning options belong to the prune job that saved the artifact.
    problem = assert_problem(api.post("/v1/jobs", json={**body, "pattern": "2:4"}), 422)
    assert "pattern" in problem["detail"] and "artifact_job_id" in problem["detail"]


def test_probe_of_an_unknown_artifact_job_is_a_problem(api: TestClient, tiny_model_dir: Path) -> None:
    body = {"kind": "probe", "model": str(tiny_model_dir), "artifact_job_id": UNKNOWN_JOB}
    problem = assert_problem(api.post("/v1/jobs", json=body), 422)
    assert problem["type"].endswith("/artifact-job-not-found") and UNKNOWN_JOB in problem["detail"]
    assert api.get("/v1/jobs").json()["items"] == []


@pytest.mark.parametrize(
    ("kind", "status", "with_artifact", "fragment"),
    [
        ("prune", "running", False, "is running, not succeeded"),
        ("prune", "queued", False, "is queued, not succeeded"),
        ("prune", "failed", False, "is failed, not succeeded"),
        ("prune", "succeeded", False, "saved no pruned model"),
        ("evaluate", "succeeded", False, "only prune jobs save"),
    ],
)
def test_probe_of_a_job_without_a_usable_artifact_is_409(
    api: TestClient,
    clean_store: Store,
    tiny_model_dir: Path,
    kind: str,
    status: str,
    with_artifact: bool,
    fragment: str,
) -> None:
    source = add_job(clean_store, str(tiny_model_dir.resolve()), kind=kind, status=status)
    body = {"kind": "probe", "model": str(tiny_model_dir), "artifact_job_id": source}
    problem = assert_problem(api.post("/v1/jobs", json=body), 409)
    assert problem["type"].endswith("/artifact-unavailable") and fragment in problem["detail"]
    assert problem["artifact_job_id"] == source


def test_probe_of_another_models_artifact_is_422(
    api: TestClient, clean_store: Store, tiny_model_dir: Path
) -> None:
    source = succeeded_prune_with_artifact(clean_store, "smollm2-135m")
    body = {"kind": "probe", "model": str(tiny_model_dir), "artifact_job_id": source}
    problem = assert_problem(api.post("/v1/jobs", json=body), 422)
    assert problem["type"].endswith("/artifact-model-mismatch") and "smollm2-135m" in problem["detail"]


def test_openapi_documents_the_probe_kind_and_methods(api: TestClient) -> None:
    spec = api.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    prune = schemas["PruneJobCreate"]["properties"]
    methods = [
        "slicegpt",
        "magnitude",
        "magnitude-row",
        "wanda",
        "sparsegpt",
        "attention-drop",
        "mlp-drop",
        "shortgpt",
    ]
    assert prune["method"]["enum"] == methods
    assert (
        "Block Influence" in prune["method"]["description"]
        and "round(sparsity * L)" in prune["sparsity"]["description"]
    )
    assert prune["pattern"]["enum"] == ["unstructured", "2:4", "4:8"]
    assert "ProbeJobCreate" in schemas and "ProbePointList" in schemas
    assert "/v1/jobs/{job_id}/probes" in spec["paths"]
    assert (
        "image/svg+xml"
        in spec["paths"]["/v1/jobs/{job_id}/probes/plot.svg"]["get"]["responses"]["200"]["content"]
    )


# --------------------------------------------------------------------------------------- reading


def fetch_all(
    api: TestClient, job_id: str, **params: Any
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every page of /probes with these filters: the items and the summary of each page."""
    items: list[dict[str, Any]] = []
    summaries = []
    cursor = None
    while True:
        query = {**params, **({"cursor": cursor} if cursor else {})}
        response = api.get(f"/v1/jobs/{job_id}/probes", params=query)
        assert response.status_code == 200, response.text
        page = response.json()
        items += page["items"]
        summaries.append(page["summary"])
        cursor = page["next_cursor"]
        if cursor is None:
            return items, summaries


def _strip(item: dict[str, Any]) -> dict[str, Any]:
    assert item["convention"] == "prunecast"  # the seeded points name none: the store's default
    return {key: value for key, value in item.items() if key not in ("id", "job_id", "convention")}


def test_probes_pages_through_exactly_the_seeded_points_in_order(api: TestClient, clean_store: Store) -> None:
    seeded = probe_job(clean_store)
    other = probe_job(clean_store)  # another job's points never leak in
    items, _ = fetch_all(api, seeded.job_id, limit=37)
    assert [item["id"] for item in items] == seeded.ids
    assert [_strip(item) for item in items] == seeded.points
    assert {item["job_id"] for item in items} == {seeded.job_id} and other.job_id != seeded.job_id
    default = api.get(f"/v1/jobs/{seeded.job_id}/probes").json()
    assert len(default["items"]) == min(500, len(seeded.ids))


@pytest.mark.parametrize(
    "filters",
    [
        {"probe": "counterfactual"},
        {"probe": "generation-sampled", "space": "tokens"},
        {"sublayer": "mlp", "space": "probs", "metric": "kl"},
        {"layer": 2},
        {"layer": 0, "sublayer": "attention"},
        {"step": 3, "probe": "generation-greedy"},
        {"metric": "prefix_agree"},
    ],
)
def test_probe_filters_return_exactly_the_matching_points(
    api: TestClient, clean_store: Store, filters: dict[str, Any]
) -> None:
    seeded = probe_job(clean_store)
    expected = [
        point_id
        for point_id, point in zip(seeded.ids, seeded.points, strict=True)
        if all(point[key] == value for key, value in filters.items())
    ]
    assert expected
    items, _ = fetch_all(api, seeded.job_id, limit=7, **filters)
    assert [item["id"] for item in items] == expected


def test_summary_pearson_matches_a_hand_computation_over_all_matching_points(
    api: TestClient, clean_store: Store
) -> None:
    seeded = probe_job(clean_store, layers=6)
    wanted = [
        p
        for p in seeded.points
        if p["probe"] == "counterfactual" and p["sublayer"] == "block" and p["space"] == "logits"
    ]
    hand = statistics.correlation([p["estimate"] for p in wanted], [p["value"] for p in wanted])
    mean_rel = statistics.fmean(abs(p["estimate"] - p["value"]) / p["value"] for p in wanted)
    # Two points a page: the summary still covers all six layers, the same on every page.
    params = {"probe": "counterfactual", "sublayer": "block", "space": "logits"}
    items, summaries = fetch_all(api, seeded.job_id, limit=2, **params)
    assert len(items) == 6 and len(summaries) == 3
    assert all(summary == summaries[0] for summary in summaries)
    (summary,) = summaries[0]
    assert summary["n"] == 6 and summary["metric"] == "1-cos"
    assert summary["correlation"] == pytest.approx(hand, rel=1e-12)
    assert summary["mean_value"] == pytest.approx(statistics.fmean(p["value"] for p in wanted))
    assert summary["mean_estimate"] == pytest.approx(statistics.fmean(p["estimate"] for p in wanted))
    assert summary["mean_relative_error"] == pytest.approx(mean_rel)


def test_summary_groups_by_probe_sublayer_space_and_metric_and_skips_points_without_estimates(
    api: TestClient, clean_store: Store
) -> None:
    seeded = probe_job(clean_store, layers=4)
    summary = api.get(f"/v1/jobs/{seeded.job_id}/probes", params={"limit": 1}).json()["summary"]
    keys = [(s["probe"], s["sublayer"], s["space"], s["metric"]) for s in summary]
    # 3 sublayers x (3 spaces at 1-cos + probs kl); generation points carry no estimate.
    assert len(keys) == 12 == len(set(keys))
    assert {key[0] for key in keys} == {"counterfactual"}
    assert all(s["n"] == 4 for s in summary)


def test_summary_never_pools_points_read_by_different_conventions() -> None:
    def point(value: float, convention: str) -> EstimatedPoint:
        return EstimatedPoint("counterfactual", "block", "probs", "kl", value, value * 1.1, False, convention)

    rows = summarize([point(v, "prunecast") for v in (1.0, 2.0, 3.0)] + [point(9.0, "released-code")] * 3)
    assert [(row.convention, row.n, row.mean_value) for row in rows] == [
        ("prunecast", 3, 2.0),
        ("released-code", 3, 9.0),
    ]


def test_summary_correlation_is_null_with_fewer_than_three_points_or_no_variance(
    api: TestClient, clean_store: Store
) -> None:
    job_id = add_job(clean_store, "m", kind="probe")
    flat = [
        dict(point, estimate=0.5)
        for point in counterfactual_points(4, ["attention"])
        if point["space"] == "logits"
    ]
    add_probe_points(clean_store, job_id, flat)
    add_probe_points(clean_store, job_id, counterfactual_points(2, ["mlp"]))
    by_key = {
        (s["sublayer"], s["space"], s["metric"]): s
        for s in api.get(f"/v1/jobs/{job_id}/probes").json()["summary"]
    }
    assert by_key[("attention", "logits", "1-cos")]["correlation"] is None  # constant estimate
    assert by_key[("mlp", "embedding", "1-cos")]["n"] == 2
    assert by_key[("mlp", "embedding", "1-cos")]["correlation"] is None


def test_pearson_agrees_with_statistics_and_refuses_degenerate_input() -> None:
    xs, ys = [1.0, 2.0, 4.0, 8.0, 9.5], [0.9, 2.5, 3.9, 8.8, 9.0]
    assert pearson(xs, ys) == pytest.approx(statistics.correlation(xs, ys), rel=1e-12)
    assert pearson([1.0, 2.0], [2.0, 1.0]) is None and pearson([1.0] * 4, [1.0, 2.0, 3.0, 4.0]) is None
    nan = float("nan")
    summary = summarize([EstimatedPoint("model", None, "probs", "kl", v, v) for v in (1.0, 2.0, nan, 3.0)])
    assert summary[0].n == 3 and summary[0].correlation == pytest.approx(1.0)


def test_probes_of_an_unknown_job_is_404_and_bad_filters_422(api: TestClient, clean_store: Store) -> None:
    assert_problem(api.get(f"/v1/jobs/{UNKNOWN_JOB}/probes"), 404)
    seeded = probe_job(clean_store, layers=2, steps=1)
    for params in (
        {"probe": "telepathy"},
        {"sublayer": "head"},
        {"limit": 5001},
        {"layer": -1},
        {"cursor": -1},
    ):
        assert_problem(api.get(f"/v1/jobs/{seeded.job_id}/probes", params=params), 422)
    empty = api.get(f"/v1/jobs/{seeded.job_id}/probes", params={"space": "nowhere"}).json()
    assert empty == {"items": [], "next_cursor": None, "summary": []}
