"""The jobs API on Postgres + Redis: validation, problem+json, idempotency, listing, auth."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from core.settings import Settings

PROBLEM = "application/problem+json"


def evaluate_body(model: str, **perplexity: Any) -> dict[str, Any]:
    return {"kind": "evaluate", "model": model, "perplexity": {"seqlen": 64, "max_windows": 2, **perplexity}}


def assert_problem(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    body: dict[str, Any] = response.json()
    assert body["status"] == status and body["title"]
    return body


def test_submit_returns_202_location_and_queued_job(api: TestClient, tiny_model_dir: Path) -> None:
    response = api.post("/v1/jobs", json=evaluate_body(str(tiny_model_dir)))
    assert response.status_code == 202, response.text
    job = response.json()
    assert response.headers["location"] == f"/v1/jobs/{job['id']}"
    assert job["status"] == "queued" and job["kind"] == "evaluate"
    assert job["model"] == str(tiny_model_dir.resolve())
    assert api.get(job["links"]["self"]).json()["id"] == job["id"]


def test_unknown_kind_is_a_problem(api: TestClient) -> None:
    body = assert_problem(api.post("/v1/jobs", json={"kind": "teleport", "model": "smollm2-135m"}), 422)
    assert "kind" in body["detail"]


def test_out_of_range_option_names_the_field(api: TestClient) -> None:
    body = assert_problem(api.post("/v1/jobs", json=evaluate_body("smollm2-135m", seqlen=4)), 422)
    assert any(error["loc"][-1] == "seqlen" for error in body["errors"])


def test_unknown_field_is_refused(api: TestClient) -> None:
    body = assert_problem(api.post("/v1/jobs", json={**evaluate_body("smollm2-135m"), "sparsty": 0.2}), 422)
    assert "sparsty" in body["detail"]


@pytest.mark.parametrize(
    ("model", "fragment"),
    [
        ("not a model!", "neither a packaged alias"),
        ("someorg/never-downloaded-model", "not in the local Hugging Face cache"),
        ("/etc", "outside the configured model roots"),
        ("../../../etc/passwd", "outside the configured model roots"),
    ],
)
def test_bad_model_is_rejected_at_submit(api: TestClient, model: str, fragment: str) -> None:
    body = assert_problem(api.post("/v1/jobs", json=evaluate_body(model)), 422)
    assert fragment in body["detail"]
    assert body["type"].endswith("/invalid-model")


def test_path_escape_through_symlink_is_rejected(api: TestClient, model_root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "config.json").write_text("{}")
    link = model_root / f"escape-{tmp_path.name}"
    link.symlink_to(outside)
    body = assert_problem(api.post("/v1/jobs", json=evaluate_body(str(link))), 422)
    assert "outside the configured model roots" in body["detail"]


def test_remote_code_models_are_refused(api: TestClient, model_root: Path) -> None:
    folder = model_root / "needs-remote-code"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text('{"auto_map": {"AutoModelForCausalLM": "x.Y"}}')
    body = assert_problem(api.post("/v1/jobs", json=evaluate_body(str(folder))), 422)
    assert "trust_remote_code" in body["detail"]


def test_oversized_body_is_413(api: TestClient) -> None:
    big = {"kind": "evaluate", "model": "x" * 2_000_000}
    assert_problem(api.post("/v1/jobs", json=big), 413)


def test_malformed_json_is_a_problem(api: TestClient) -> None:
    response = api.post("/v1/jobs", content=b"{not json", headers={"content-type": "application/json"})
    assert_problem(response, 422)


def test_unknown_job_is_404_problem(api: TestClient) -> None:
    assert_problem(api.get("/v1/jobs/00000000-0000-0000-0000-000000000000"), 404)
    assert_problem(api.delete("/v1/jobs/nope"), 404)


def test_idempotency_key_replays_same_job_and_refuses_a_different_body(
    api: TestClient, tiny_model_dir: Path
) -> None:
    headers = {"Idempotency-Key": "ci-run-42"}
    first = api.post("/v1/jobs", json=evaluate_body(str(tiny_model_dir)), headers=headers)
    again = api.post("/v1/jobs", json=evaluate_body(str(tiny_model_dir)), headers=headers)
    assert first.status_code == 202 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    different = api.post("/v1/jobs", json=evaluate_body(str(tiny_model_dir), max_windows=3), headers=headers)
    body = assert_problem(different, 422)
    assert body["job_id"] == first.json()["id"]
    assert len(api.get("/v1/jobs").json()["items"]) == 1


def test_list_filters_and_cursor_pagination(api: TestClient, tiny_model_dir: Path) -> None:
    ids = [
        api.post("/v1/jobs", json=evaluate_body(str(tiny_model_dir), max_windows=n)).json()["id"]
        for n in range(1, 6)
    ]
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 2, "kind": "evaluate"}
        if cursor:
            params["cursor"] = cursor
        page = api.get("/v1/jobs", params=params).json()
        seen += [job["id"] for job in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))
    assert api.get("/v1/jobs", params={"status": "succeeded"}).json()["items"] == []
    assert api.get("/v1/jobs", params={"model": "other"}).json()["items"] == []
    assert_problem(api.get("/v1/jobs", params={"status": "sleeping"}), 422)


def test_cancel_queued_job_never_runs_and_cannot_cancel_twice(api: TestClient, tiny_model_dir: Path) -> None:
    job = api.post("/v1/jobs", json=evaluate_body(str(tiny_model_dir))).json()
    canceled = api.delete(f"/v1/jobs/{job['id']}")
    assert canceled.status_code == 200 and canceled.json()["status"] == "canceled"
    assert_problem(api.delete(f"/v1/jobs/{job['id']}"), 409)


def test_wait_returns_at_timeout_for_a_job_that_does_not_end(api: TestClient, tiny_model_dir: Path) -> None:
    job = api.post("/v1/jobs", json=evaluate_body(str(tiny_model_dir))).json()
    waited = api.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 0.3})
    assert waited.status_code == 200 and waited.json()["status"] == "queued"
    assert_problem(api.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": -1}), 422)


def test_results_filters_validate_ranges(api: TestClient) -> None:
    assert api.get("/v1/results").json() == {"items": [], "next_cursor": None}
    assert_problem(api.get("/v1/results", params={"sparsity_min": 0.5, "sparsity_max": 0.1}), 422)
    assert_problem(api.get("/v1/results", params={"sparsity_min": 2}), 422)


def test_bearer_tokens_guard_v1_but_not_health(rq_settings: Settings) -> None:
    token = "t" * 24
    settings = rq_settings.model_copy(update={"api_tokens": [token]})
    with TestClient(create_app(settings, start_background=False)) as client:
        body = assert_problem(client.get("/v1/jobs"), 401)
        assert body["type"].endswith("/unauthorized")
        assert client.get("/v1/jobs").headers["www-authenticate"].startswith("Bearer")
        assert_problem(client.get("/v1/jobs", headers={"Authorization": "Bearer wrong-token-xxxxxxxx"}), 401)
        assert client.get("/v1/jobs", headers={"Authorization": f"Bearer {token}"}).status_code == 200
        assert client.get("/healthz").status_code == 200


def test_health_ready_and_metrics(api: TestClient, tiny_model_dir: Path) -> None:
    assert api.get("/healthz").json()["status"] == "ok"
    ready = api.get("/readyz").json()
    assert ready == {"status": "ok", "checks": {"store": "ok", "queue": "ok"}}
    api.post("/v1/jobs", json=evaluate_body(str(tiny_model_dir)))
    text = api.get("/metrics").text
    assert 'prunecast_jobs{kind="evaluate",status="queued"} 1.0' in text
    assert "prunecast_queue_depth 1.0" in text
    assert 'prunecast_http_requests_total{method="POST",route="/v1/jobs",status="202"}' in text
    assert "prunecast_http_request_duration_seconds_bucket" in text


def test_readyz_reports_unreachable_queue(make_settings: Any, clean_store: Any) -> None:
    settings = make_settings(database_url=clean_store.url, redis_url="redis://127.0.0.1:1/0")
    with TestClient(create_app(settings, start_background=False)) as client:
        response = client.get("/readyz")
        assert response.status_code == 503
        assert response.json()["checks"]["queue"].startswith("unavailable")


def test_readyz_tells_only_a_trusted_caller_why_a_check_failed(make_settings: Any, clean_store: Any) -> None:
    settings = make_settings(
        database_url=clean_store.url, redis_url="redis://127.0.0.1:1/0", api_tokens=["ready-token-0123456789"]
    )
    with TestClient(create_app(settings, start_background=False)) as client:
        public = client.get("/readyz")
        trusted = client.get("/readyz", headers={"Authorization": "Bearer ready-token-0123456789"})
    assert public.status_code == 503 and public.json()["checks"] == {"store": "ok", "queue": "unavailable"}
    assert "127.0.0.1" not in public.text and "Error" not in public.text
    assert trusted.status_code == 503 and "127.0.0.1:1" in trusted.json()["checks"]["queue"]


def test_submit_survives_a_queue_outage_and_the_job_stays_queued(
    make_settings: Any, clean_store: Any, tiny_model_dir: Path
) -> None:
    settings = make_settings(database_url=clean_store.url, redis_url="redis://127.0.0.1:1/0")
    with TestClient(create_app(settings, start_background=False)) as client:
        response = client.post("/v1/jobs", json=evaluate_body(str(tiny_model_dir)))
        assert response.status_code == 202
        assert client.get(response.headers["location"]).json()["status"] == "queued"


def test_openapi_documents_tags_and_problem_bodies(api: TestClient) -> None:
    spec = api.get("/openapi.json").json()
    assert {tag["name"] for tag in spec["tags"]} >= {"jobs", "results", "health"}
    assert "Problem" in spec["components"]["schemas"]
    assert api.get("/docs").status_code == 200
