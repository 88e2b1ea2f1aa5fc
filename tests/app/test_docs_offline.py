"""/docs and /redoc work with no network: Swagger UI and ReDoc come from the installed package
(fastapi-offline), never from a CDN. Headless Chromium loads each page with every host but the
loopback unresolvable and must find the operations rendered."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from core.settings import Settings
from core.store import Store
from tests.app.live_server import live_server

CHROMIUM = Path("/usr/bin/chromium")
NO_NETWORK = "MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"


def test_docs_pages_name_no_outside_host(api: TestClient) -> None:
    for page in ("/docs", "/redoc"):
        html = api.get(page).text
        assert "cdn." not in html and "https://" not in html, page
        assert "/static-offline-docs/" in html, page
    assert api.get("/static-offline-docs/swagger-ui-bundle.js").status_code == 200
    assert api.get("/static-offline-docs/redoc.standalone.js").status_code == 200


def _rendered_dom(url: str, profile: Path) -> str:
    command = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--host-resolver-rules={NO_NETWORK}",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=15000",  # let the page's scripts fetch /openapi.json and render
        "--dump-dom",
        url,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="headless Chromium not installed: apt-get install -y --no-install-recommends chromium",
)
def test_swagger_ui_and_redoc_render_the_operations_with_no_network(
    make_settings: Callable[..., Settings], clean_store: Store, tmp_path: Path
) -> None:
    settings = make_settings(database_url=clean_store.url, embedded_worker=False)
    with live_server(settings) as url:
        swagger = _rendered_dom(f"{url}/docs", tmp_path / "swagger")
        redoc = _rendered_dom(f"{url}/redoc", tmp_path / "redoc")
    assert 'class="swagger-ui' in swagger and "opblock" in swagger, swagger[-2000:]
    assert 'data-path="/v1/jobs"' in swagger and "Submit Job" in swagger  # POST /v1/jobs, rendered
    assert "Submit Job" in redoc and "/v1/jobs" in redoc, redoc[-2000:]
