"""The OpenAPI document says what the API does (issue 33, item 7): a request the spec accepts is not
refused for a rule the spec could have stated. Each rule is checked twice: the spec states it
(or, where JSON Schema cannot, the parameter's description does) and the API answers the documented
status. Also: a body that is not JSON at all is the documented 422, a 405's `Allow` lists every
method of the path, and the documentation pages can be put behind the API token."""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Iterator
from typing import Any

import jsonschema_rs
import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel, ValidationError

from app.deps import carries_token
from app.main import create_app
from app.middleware import NO_NUL_PATTERN
from app.schemas.predictions import MetricSpec, PredictionCreate
from core.settings import Settings
from core.specs.probe import ProbeJobCreate
from core.store import Store
from tests.app.test_jobs_api import assert_problem

TOKEN = "spec-says-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JOB_ID = "00000000-0000-7000-8000-000000000000"


@pytest.fixture
def guarded(make_settings: Callable[..., Settings], clean_store: Store) -> Iterator[TestClient]:
    """The API on PostgreSQL with a token required everywhere, the documentation included."""
    settings = make_settings(database_url=clean_store.url, api_tokens=[TOKEN], docs_require_token=True)
    with TestClient(create_app(settings, start_background=False)) as client:
        yield client


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The OpenAPI document as served (building it needs no store)."""
    settings = Settings(home=tmp_path_factory.mktemp("spec-home"), embedded_worker=False)
    schema: dict[str, Any] = create_app(settings, start_background=False).openapi()
    return schema


def _accepts(spec: dict[str, Any], schema: dict[str, Any], instance: Any) -> bool:
    """Whether `schema` (with its `$ref`s into the spec's components) accepts `instance`."""
    return bool(
        jsonschema_rs.Draft202012Validator({**schema, "components": spec["components"]}).is_valid(instance)
    )


def _component(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _pydantic_accepts(model: type[BaseModel], instance: dict[str, Any]) -> bool:
    try:
        model.model_validate(instance)
    except ValidationError:
        return False
    return True


def _free_strings(node: Any) -> Iterator[dict[str, Any]]:
    """Every string schema in `node` without an enum, const or pattern of its own, inline."""
    if isinstance(node, dict):
        if node.get("type") == "string" and not {"enum", "const"} & node.keys():
            yield node
        for value in node.values():
            yield from _free_strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from _free_strings(item)


# -------------------------------------------------------------------------------------- NUL bytes


def test_every_path_and_query_string_in_the_spec_excludes_nul(spec: dict[str, Any]) -> None:
    checked = 0
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            for parameter in operation.get("parameters", []):
                if parameter["in"] not in ("path", "query"):
                    continue
                for string in _free_strings(parameter["schema"]):
                    where = (method, path, parameter["name"])
                    assert re.search(string["pattern"], "a\x00b") is None, where
                    if string["pattern"] == NO_NUL_PATTERN:
                        assert re.search(NO_NUL_PATTERN, "ünïcode\u2603/é") is not None
                        checked += 1
    assert checked >= 20


def test_every_request_body_string_excludes_nul_and_responses_are_left_alone(spec: dict[str, Any]) -> None:
    schemas = spec["components"]["schemas"]
    for name in ("EvaluateJobCreate", "ProbePromptSpec", "CalibrationSpec", "PredictionCreate"):
        strings = list(_free_strings(schemas[name]))
        assert strings, name
        assert all(re.search(string["pattern"], "\x00") is None for string in strings), name
    assert "pattern" not in schemas["Problem"]["properties"]["instance"]["anyOf"][0]  # echoes a refused path
    body = spec["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert not _accepts(spec, body, {"kind": "evaluate", "model": "m\x00"})
    assert _accepts(spec, body, {"kind": "evaluate", "model": "m"})
    assert NO_NUL_PATTERN == "^[^\\u0000]*$"  # ECMA-262 and Python alike; no surrogates (see its docstring)


def test_a_nul_in_a_query_the_spec_refuses_is_the_documented_422(guarded: TestClient) -> None:
    operation = guarded.get("/openapi.json", headers=AUTH).json()["paths"]["/v1/results"]["get"]
    model = next(p for p in operation["parameters"] if p["name"] == "model")
    assert re.search(model["schema"]["anyOf"][0]["pattern"], "a\x00b") is None
    assert "422" in operation["responses"]
    problem = assert_problem(guarded.get("/v1/results?model=a%00b", headers=AUTH), 422)
    assert problem["errors"][0]["loc"] == ["query", "'model'"]


# --------------------------------------------------------------------- metric and task, in a body

METRIC_CASES = [
    ({"metric": "acc"}, False),
    ({"metric": "acc", "task": None}, False),
    ({"metric": "acc_norm", "task": "piqa"}, True),
    ({"metric": "ppl"}, True),
    ({"metric": "ppl", "task": None}, True),
    ({"metric": "ppl", "task": "piqa"}, False),
]


@pytest.mark.parametrize(("metric", "valid"), METRIC_CASES)
def test_the_spec_refuses_exactly_the_metric_specs_the_validator_refuses(
    spec: dict[str, Any], metric: dict[str, Any], valid: bool
) -> None:
    assert _accepts(spec, _component("MetricSpec"), metric) is valid
    assert _pydantic_accepts(MetricSpec, metric) is valid


@pytest.mark.parametrize(
    ("point", "valid"),
    [
        ({"metric": "acc", "task": "piqa", "sparsity": 0.0, "value": 0.7}, True),
        ({"metric": "acc", "sparsity": 0.0, "value": 0.7}, False),
        ({"metric": "ppl", "sparsity": 0.0, "value": 20.0}, True),
        ({"metric": "ppl", "task": "piqa", "sparsity": 0.0, "value": 20.0}, False),
    ],
)
def test_the_spec_refuses_a_callers_point_with_a_task_where_the_api_does(
    spec: dict[str, Any], point: dict[str, Any], valid: bool
) -> None:
    metric = {"metric": point["metric"], "task": "piqa"} if point["metric"] != "ppl" else {"metric": "ppl"}
    body = {"model": "m", "sparsities": [0.2], "metrics": [metric], "points": [point]}
    assert _accepts(spec, _component("PredictionCreate"), body) is valid
    assert _pydantic_accepts(PredictionCreate, body) is valid


@pytest.mark.parametrize("metric", [{"metric": "acc"}, {"metric": "ppl", "task": "piqa"}])
def test_a_prediction_of_an_accuracy_without_task_or_ppl_with_one_is_a_422(
    guarded: TestClient, metric: dict[str, Any]
) -> None:
    body = {"model": "m", "sparsities": [0.2], "metrics": [metric]}
    problem = assert_problem(guarded.post("/v1/predictions", json=body, headers=AUTH), 422)
    assert problem["errors"][0]["loc"][:3] == ["body", "metrics", "0"]


# ------------------------------------------------------------------------------ a probe's subject

PROBE_CASES = [
    ({}, False),
    ({"method": "wanda", "sparsity": 0.5}, True),
    ({"method": "wanda"}, False),
    ({"sparsity": 0.5}, False),
    ({"artifact_job_id": JOB_ID}, True),
    ({"artifact_job_id": JOB_ID, "method": None, "round_to": 8, "pattern": "unstructured"}, True),
    ({"artifact_job_id": JOB_ID, "method": "wanda", "sparsity": 0.5}, False),
    ({"artifact_job_id": JOB_ID, "sparsity": 0.5}, False),
    ({"artifact_job_id": JOB_ID, "round_to": 16}, False),
    ({"artifact_job_id": JOB_ID, "calibration": {"num_sequences": 128}}, True),
    ({"artifact_job_id": JOB_ID, "calibration": {"num_sequences": 64}}, False),
    ({"artifact_job_id": JOB_ID, "calibration": {"seed": 3}}, False),
]


@pytest.mark.parametrize(("fields", "valid"), PROBE_CASES)
def test_the_spec_refuses_exactly_the_probe_jobs_the_validator_refuses(
    spec: dict[str, Any], fields: dict[str, Any], valid: bool
) -> None:
    job = {"kind": "probe", "model": "m", **fields}
    body = spec["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert _accepts(spec, body, job) is valid
    assert _pydantic_accepts(ProbeJobCreate, job) is valid


def test_a_probe_job_without_method_or_artifact_is_a_422(guarded: TestClient) -> None:
    problem = assert_problem(
        guarded.post("/v1/jobs", json={"kind": "probe", "model": "m"}, headers=AUTH), 422
    )
    assert "give either `method`" in problem["detail"]


# ------------------------------------------------------------- rules across query parameters


def _parameter(spec: dict[str, Any], path: str, name: str) -> dict[str, Any]:
    parameters: list[dict[str, Any]] = spec["paths"][path]["get"]["parameters"]
    return next(parameter for parameter in parameters if parameter["name"] == name)


def test_rules_across_query_parameters_are_in_their_descriptions(spec: dict[str, Any]) -> None:
    curves = "/v1/models/{model}/curves"
    assert "required with them" in _parameter(spec, curves, "task")["description"]
    assert "refused with `ppl`" in _parameter(spec, curves, "task")["description"]
    assert "required with them" in _parameter(spec, curves, "metric")["description"]
    assert "At most `sparsity_max`" in _parameter(spec, "/v1/results", "sparsity_min")["description"]
    assert "At least `sparsity_min`" in _parameter(spec, "/v1/results", "sparsity_max")["description"]


@pytest.mark.parametrize("query", ["metric=acc", "metric=acc_norm", "metric=ppl&task=piqa", "task=piqa"])
def test_a_curve_of_an_accuracy_without_task_or_ppl_with_one_is_a_422(
    guarded: TestClient, query: str
) -> None:
    problem = assert_problem(guarded.get(f"/v1/models/m/curves?{query}", headers=AUTH), 422)
    assert "task" in problem["detail"]


def test_an_empty_sparsity_range_is_a_422_naming_the_parameter(guarded: TestClient) -> None:
    response = guarded.get("/v1/results?sparsity_min=0.5&sparsity_max=0.1", headers=AUTH)
    problem = assert_problem(response, 422)
    assert problem["errors"][0]["loc"] == ["query", "sparsity_min"] and "0.5" in problem["detail"]
    assert guarded.get("/v1/results?sparsity_min=0.3&sparsity_max=0.3", headers=AUTH).status_code == 200


# -------------------------------------------------------------------------- bodies that are not JSON


@pytest.mark.parametrize(
    "raw",
    [b"\xff\xfe{", b'{"kind": "evaluate", "model": "\xff"}', b"[" * 100_000, b"{not json"],
    ids=["utf-16-bom", "latin-1", "nested-past-the-recursion-limit", "syntax-error"],
)
def test_a_body_that_is_not_json_is_the_documented_422_on_every_body_taking_route(
    guarded: TestClient, raw: bytes
) -> None:
    spec = guarded.get("/openapi.json", headers=AUTH).json()
    body_taking = [
        (method, path)
        for path, operations in spec["paths"].items()
        for method, operation in operations.items()
        if "requestBody" in operation
    ]
    assert ("post", "/v1/jobs") in body_taking and ("post", "/v1/predictions") in body_taking
    for method, path in body_taking:
        assert "400" not in spec["paths"][path][method]["responses"], (method, path)
        assert "422" in spec["paths"][path][method]["responses"], (method, path)
        headers = {**AUTH, "Content-Type": "application/json"}
        response = guarded.request(method.upper(), path, content=raw, headers=headers)
        problem = assert_problem(response, 422)
        assert problem["errors"][0]["type"] == "json_invalid", (path, problem)
        assert problem["type"].endswith("/validation-error")


# --------------------------------------------------------------------------------------- Allow


def test_options_on_a_job_lists_every_method_the_path_serves(guarded: TestClient) -> None:
    response = guarded.options(f"/v1/jobs/{JOB_ID}")
    assert_problem(response, 405)
    assert response.headers["allow"] == "GET, DELETE"
    assert guarded.request("PUT", "/v1/jobs").headers["allow"] == "GET, POST"


def test_every_405_allows_exactly_the_methods_the_spec_documents(guarded: TestClient) -> None:
    spec = guarded.get("/openapi.json", headers=AUTH).json()
    for template, operations in spec["paths"].items():
        path = re.sub(r"\{[^}]+\}", "1", template)
        response = guarded.options(path)
        assert response.status_code == 405, (path, response.text)
        allowed = {method.strip() for method in response.headers["allow"].split(",")}
        assert allowed == {method.upper() for method in operations}, path


# -------------------------------------------------------------------------- docs behind the token

DOCS = ["/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"]


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


@pytest.mark.parametrize("path", DOCS)
def test_the_docs_need_the_token_when_asked(guarded: TestClient, path: str) -> None:
    response = guarded.get(path)
    assert_problem(response, 401)
    assert response.headers["www-authenticate"].startswith("Basic realm=")  # the browser's login prompt
    assert_problem(guarded.get(path, headers=_basic("me", "not-the-token-0123456789")), 401)
    assert_problem(guarded.get(path, headers={"Authorization": "Bearer not-the-token-0123"}), 401)
    assert guarded.get(path, headers=AUTH).status_code == 200
    assert guarded.get(path, headers=_basic("anyone", TOKEN)).status_code == 200
    assert guarded.get(path, headers=_basic("", TOKEN)).status_code == 200


def test_the_docs_pages_fetch_the_spec_from_their_own_server(guarded: TestClient) -> None:
    """A browser sends the Basic credentials it was asked for with the page's own same-origin
    fetches, so the document loads once the page did; the offline scripts stay public."""
    for page in ("/docs", "/redoc"):
        html = guarded.get(page, headers=_basic("me", TOKEN)).text
        assert "'/openapi.json'" in html or '"/openapi.json"' in html, page
    assert guarded.get("/static-offline-docs/swagger-ui-bundle.js").status_code == 200
    assert guarded.get("/static-offline-docs/redoc.standalone.js").status_code == 200
    assert guarded.get("/healthz").status_code == 200


@pytest.mark.parametrize(
    "overrides",
    [{"api_tokens": [TOKEN]}, {"docs_require_token": True}],
    ids=["tokens-but-docs-left-open", "asked-but-no-tokens"],
)
def test_the_docs_stay_open_by_default_and_without_tokens(
    make_settings: Callable[..., Settings], clean_store: Store, overrides: dict[str, Any]
) -> None:
    settings = make_settings(database_url=clean_store.url, **overrides)
    with TestClient(create_app(settings, start_background=False)) as client:
        for path in DOCS:
            assert client.get(path).status_code == 200, path


@pytest.mark.parametrize(
    ("authorization", "basic", "carries"),
    [
        (f"Bearer {TOKEN}", False, True),
        (f"bearer  {TOKEN} ", False, True),
        (_basic("u", TOKEN)["Authorization"], False, False),  # /readyz and /v1 take bearer tokens only
        (_basic("u", TOKEN)["Authorization"], True, True),
        (f"Basic {TOKEN}", True, False),  # not base64 of user:password
        ("Basic !!!!", True, False),
        (_basic(TOKEN, "")["Authorization"], True, False),  # the token is the password, not the user
        ("Bearer", True, False),
        ("", True, False),
    ],
)
def test_carries_token_reads_a_bearer_token_and_on_request_a_basic_password(
    authorization: str, basic: bool, carries: bool
) -> None:
    assert carries_token(authorization, [TOKEN], basic=basic) is carries
