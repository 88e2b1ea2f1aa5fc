"""Property-based run over the OpenAPI spec: whatever schemathesis sends, never a 5xx, and every
error body is problem+json."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from app.config import Settings
from app.migrate import upgrade
from tests.app.live_server import live_server


@pytest.fixture(scope="module")
def api_schema(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    home = tmp_path_factory.mktemp("fuzz-home")
    roots = tmp_path_factory.mktemp("fuzz-models")
    # Embedded store, worker thread off: valid jobs are accepted and stay queued, never run.
    app_settings = Settings(home=home, model_roots=[roots], embedded_worker=False, log_level="WARNING")
    upgrade(app_settings.store_url)
    with live_server(app_settings) as base_url:
        yield schemathesis.openapi.from_url(f"{base_url}/openapi.json")


def test_no_server_errors_and_problem_bodies(api_schema: Any) -> None:
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 8
    statuses: list[int] = []
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def check(case: Any) -> None:
            if case.path.endswith("/wait"):
                case.query = {**(case.query or {}), "timeout": 0.05}
            response = case.call(timeout=30)
            statuses.append(response.status_code)
            where = f"{case.method} {case.formatted_path}"
            assert response.status_code < 500, (where, response.text)
            if response.status_code >= 400:
                content_type = response.headers.get("content-type", [""])
                content_type = content_type[0] if isinstance(content_type, list) else content_type
                assert content_type.startswith("application/problem+json"), (where, response.text)

        check()
    assert len(statuses) >= 100, "the fuzzer barely ran"
    assert {200, 404, 422} <= set(statuses), sorted(set(statuses))
