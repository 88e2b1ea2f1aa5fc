"""Property-based run over the OpenAPI spec, as an attacker or a careless client would send it:
several thousand generated requests against a live server on PostgreSQL with API tokens on.

Every check schemathesis has runs on every response (no server error, status codes, content types,
headers and bodies as documented, auth really enforced, unsupported methods refused, ...) except
`positive_data_acceptance`: schema-valid bodies can still be semantically invalid here (a model that
does not exist, fields that exclude each other), and those are 422 problems by design. On top, every
error body must be problem+json.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import checks

from core.migrate import upgrade
from core.settings import Settings
from tests.app.live_server import live_server
from tests.conftest import scratch_database

TOKEN = "fuzz-token-0123456789abcdef"
EXAMPLES_PER_OPERATION = 200
AUTH = {"Authorization": f"Bearer {TOKEN}"}
pytestmark = pytest.mark.services  # its own scratch database and the shared Redis


@pytest.fixture(scope="module")
def fuzz_pg_url() -> Iterator[str]:
    """A database of its own: the fuzzer stores whatever it manages to submit."""
    with scratch_database("prunecast_fuzz") as url:
        yield url


@pytest.fixture(scope="module")
def api_schema(tmp_path_factory: pytest.TempPathFactory, fuzz_pg_url: str) -> Iterator[Any]:
    upgrade(fuzz_pg_url)
    # Worker thread off: valid jobs are accepted and stay queued, never run.
    app_settings = Settings(
        home=tmp_path_factory.mktemp("fuzz-home"),
        model_roots=[tmp_path_factory.mktemp("fuzz-models")],
        database_url=fuzz_pg_url,
        embedded_worker=False,
        api_tokens=[TOKEN],
        metrics_require_token=True,
        log_level="WARNING",
    )
    with live_server(app_settings) as base_url:
        yield schemathesis.openapi.from_url(f"{base_url}/openapi.json")


def test_thousands_of_generated_requests_meet_the_spec_with_no_server_error(api_schema: Any) -> None:
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 18
    statuses: list[int] = []
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        def check(case: Any) -> None:
            if case.path.endswith("/wait"):
                case.query = {**(case.query or {}), "timeout": 0.05}
            response = case.call(headers=AUTH, timeout=30)
            statuses.append(response.status_code)
            case.validate_response(response, excluded_checks=[checks.positive_data_acceptance], headers=AUTH)
            if response.status_code >= 400:
                content_type = response.headers.get("content-type", [""])
                content_type = content_type[0] if isinstance(content_type, list) else content_type
                where = f"{case.method} {case.formatted_path}"
                assert content_type.startswith("application/problem+json"), (where, response.text)

        check()
    assert len(statuses) >= 2500, f"the fuzzer barely ran ({len(statuses)} requests)"
    assert max(statuses) < 500
    assert {200, 404, 422} <= set(statuses), sorted(set(statuses))
