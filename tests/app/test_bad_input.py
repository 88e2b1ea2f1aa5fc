"""Bad input never reaches the store as a crash: out-of-range ids, characters PostgreSQL cannot hold,
and odd bearer tokens are clear 4xx problems; the spec says so for every operation."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from core.settings import Settings
from core.store import Store
from core.tables import MAX_ROW_ID
from tests.app.test_jobs_api import assert_problem, evaluate_body

TOKEN = "bad-input-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def guarded(make_settings: Callable[..., Settings], clean_store: Store) -> Iterator[TestClient]:
    """The API on PostgreSQL with a token required everywhere, /metrics included."""
    settings = make_settings(database_url=clean_store.url, api_tokens=[TOKEN], metrics_require_token=True)
    with TestClient(create_app(settings, start_background=False)) as client:
        yield client


@pytest.mark.parametrize(
    "path",
    [
        f"/v1/fits/{MAX_ROW_ID + 1}",
        f"/v1/fits?cursor={MAX_ROW_ID + 1}",
        f"/v1/results?cursor={2**40}",
        f"/v1/jobs/00000000-0000-7000-8000-000000000000/probes?cursor={MAX_ROW_ID + 1}",
        f"/v1/jobs/00000000-0000-7000-8000-000000000000/probes?layer={2**33}",
    ],
)
def test_ids_and_cursors_beyond_the_32_bit_columns_are_a_422(guarded: TestClient, path: str) -> None:
    problem = assert_problem(guarded.get(path, headers=AUTH), 422)
    assert "less than or equal to 2147483647" in problem["detail"]


def test_the_largest_storable_id_is_an_ordinary_404(guarded: TestClient) -> None:
    assert_problem(guarded.get(f"/v1/fits/{MAX_ROW_ID}", headers=AUTH), 404)


@pytest.mark.parametrize(
    ("path", "named"),
    [
        ("/v1/results?model=a%00b", "query 'model'"),
        ("/v1/jobs?kind=%00", "query 'kind'"),
        ("/v1/fits?dataset=x&method=%00", "query 'method'"),
        ("/v1/jobs/abc%00def", "path"),
        ("/v1/models/m%00/curves", "path"),
        ("/v1/results?model=%ED%A0%80", "query 'model'"),  # a lone surrogate's UTF-8 bytes
    ],
)
def test_a_nul_or_unencodable_character_in_a_path_or_query_is_a_422_naming_it(
    guarded: TestClient, path: str, named: str
) -> None:
    problem = assert_problem(guarded.get(path, headers=AUTH), 422)
    assert problem["detail"].startswith(named) and "the store cannot hold" in problem["detail"]


@pytest.mark.parametrize(
    ("path", "body", "named"),
    [
        ("/v1/predictions", {"model": "m\u0000", "sparsities": [0.2]}, "`model`"),
        ("/v1/jobs", {"kind": "evaluate", "model": "smollm2-135m", "revision": "x\u0000"}, "`revision`"),
        (
            "/v1/jobs",
            {
                "kind": "prune",
                "model": "m",
                "method": "wanda",
                "sparsity": 0.5,
                "calibration": {"corpus": "text", "text": "a\ud800b"},
            },
            "`calibration.text`",
        ),
        (
            "/v1/jobs",
            {
                "kind": "probe",
                "model": "m",
                "method": "wanda",
                "sparsity": 0.5,
                "prompts": [{"text": "\u0000"}],
            },
            "`prompts[0].text`",
        ),
    ],
)
def test_a_nul_or_lone_surrogate_in_a_body_is_a_422_naming_the_field(
    guarded: TestClient, path: str, body: dict[str, Any], named: str
) -> None:
    raw = json.dumps(body)  # ASCII with \u escapes: a lone surrogate travels as JSON allows
    response = guarded.post(path, content=raw, headers={**AUTH, "Content-Type": "application/json"})
    problem = assert_problem(response, 422)
    assert named in problem["detail"] and "the store cannot hold" in problem["detail"]


@pytest.mark.parametrize(
    "authorization",
    [
        "Bearer t\u00f6ken-0123456789abcdef".encode().decode("latin-1"),  # non-ASCII bytes
        "Bearer " + TOKEN[:-1] + "\u00ff",
        "Bearer",
        "Basic " + TOKEN,
        "Bearer  " + TOKEN + "x",
    ],
)
def test_a_malformed_or_non_ascii_bearer_token_is_a_401(guarded: TestClient, authorization: str) -> None:
    response = guarded.get("/v1/jobs", headers={"Authorization": authorization.encode("latin-1")})
    assert_problem(response, 401)
    assert response.headers["www-authenticate"].startswith("Bearer")


def test_metrics_are_behind_the_token_when_asked(guarded: TestClient) -> None:
    assert_problem(guarded.get("/metrics"), 401)
    assert guarded.get("/metrics", headers=AUTH).status_code == 200
    assert guarded.get("/healthz").status_code == 200  # liveness never needs a token


def test_metrics_stay_open_to_scrapers_by_default(api: TestClient) -> None:
    assert api.get("/metrics").status_code == 200


def test_readiness_failure_is_a_503_problem_with_the_checks(
    make_settings: Callable[..., Settings], clean_store: Store
) -> None:
    settings = make_settings(database_url=clean_store.url, redis_url="redis://127.0.0.1:1/0")
    with TestClient(create_app(settings, start_background=False)) as client:
        response = client.get("/readyz")
    problem = assert_problem(response, 503)
    assert problem["checks"]["store"] == "ok" and problem["checks"]["queue"].startswith("unavailable")
    assert "queue" in problem["detail"] and response.headers["retry-after"]


def test_the_spec_documents_every_error_as_problem_json(guarded: TestClient) -> None:
    spec = guarded.get("/openapi.json").json()
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            assert {"422", "503"} <= set(responses), (method, path)
            if path.startswith("/v1/") or path == "/metrics":
                assert "401" in responses, (method, path)
            if "requestBody" in operation:
                assert "413" in responses, (method, path)
            for status, response in responses.items():
                if status[0] in "45":
                    assert list(response["content"]) == ["application/problem+json"], (method, path, status)


def test_a_filter_with_storable_non_ascii_text_is_an_ordinary_query(
    guarded: TestClient, tiny_model_dir: Path
) -> None:
    job = guarded.post("/v1/jobs", json=evaluate_body(str(tiny_model_dir)), headers=AUTH).json()
    listed = guarded.get("/v1/jobs", params={"model": "ünïcode\u2603"}, headers=AUTH).json()
    assert listed["items"] == [] and job["status"] == "queued"
