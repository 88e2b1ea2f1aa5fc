"""GET /v1/jobs/{id}/report: the job's page, escaped, with its curves inline; and what a browser shows."""

from __future__ import annotations

import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from core.settings import Settings
from core.store import Store
from tests.app.live_server import live_server
from tests.app.store_points import OPT_125M_DENSE, add_job, add_series
from tests.app.test_jobs_api import assert_problem

CHROMIUM = Path("/usr/bin/chromium")
EVIL = '<script>alert("x")</script>/m&"\'-->'


def sweep_job(store: Store, model: str) -> tuple[str, list[int]]:
    job_id = add_job(store, model, kind="sweep", method="slicegpt", sparsities=[0.0, 0.1, 0.2, 0.3])
    ids = add_series(store, model, OPT_125M_DENSE, [(0.1, 29.33), (0.2, 34.53), (0.3, 44.61)], job_id=job_id)
    return job_id, ids


def test_report_shows_the_job_its_results_curves_and_a_probe_placeholder(
    api: TestClient, clean_store: Store
) -> None:
    job_id, ids = sweep_job(clean_store, "facebook/opt-125m")
    response = api.get(f"/v1/jobs/{job_id}/report")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/html")
    assert "script-src" not in response.headers["content-security-policy"]
    assert "default-src 'none'" in response.headers["content-security-policy"]
    page = response.text
    assert job_id in page and "succeeded" in page and "sweep" in page
    for result_id, value in zip(ids, ("27.64", "29.33", "34.53", "44.61"), strict=True):
        assert f'<td class="num">{result_id}</td>' in page and value in page
    assert page.count("<svg") == 1  # one (model, method, metric): ppl after slicegpt
    svg = page[page.index("<svg") : page.index("</svg>") + len("</svg>")]
    ET.fromstring(svg)
    assert "calibrated law" in page and 'id="probes"' in page and "No probes" in page
    assert "<script" not in page


def test_report_escapes_a_malicious_model_name_everywhere(api: TestClient, clean_store: Store) -> None:
    job_id = add_job(clean_store, EVIL, kind="prune", status="failed", error=EVIL)
    with clean_store.session() as session:
        from core.tables import Job

        row = session.get(Job, job_id)
        assert row is not None
        row.error = f"slicing failed on {EVIL}"
    add_series(clean_store, EVIL, 20.0, [(0.2, 26.0)], job_id=job_id)
    page = api.get(f"/v1/jobs/{job_id}/report").text
    assert "<script" not in page and "alert(&quot;x&quot;)" in page
    assert "&lt;script&gt;" in page and "--><" not in page
    svg = page[page.index("<svg") : page.index("</svg>") + len("</svg>")]
    ET.fromstring(svg)  # the title with the name is escaped inside the SVG too


def test_report_of_an_unknown_job_is_404_and_a_job_without_results_says_so(
    api: TestClient, clean_store: Store
) -> None:
    assert_problem(api.get("/v1/jobs/00000000-0000-0000-0000-000000000000/report"), 404)
    job_id = add_job(clean_store, "facebook/opt-125m", kind="evaluate", status="queued")
    page = api.get(f"/v1/jobs/{job_id}/report").text
    assert "No results stored" in page and "queued" in page and "<svg" not in page


def _screenshot(url: str, out: Path, profile: Path) -> subprocess.CompletedProcess[str]:
    command = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        f"--screenshot={out}",
        "--window-size=1200,1600",
        url,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="headless Chromium not installed: apt-get install -y --no-install-recommends chromium",
)
def test_report_renders_in_headless_chromium(
    make_settings: Callable[..., Settings], clean_store: Store, tmp_path: Path
) -> None:
    job_id, _ = sweep_job(clean_store, "facebook/opt-125m")
    settings = make_settings(database_url=clean_store.url, embedded_worker=False)
    png = tmp_path / "report.png"
    with live_server(settings) as url:
        done = _screenshot(f"{url}/v1/jobs/{job_id}/report", png, tmp_path / "chromium-profile")
    assert png.is_file(), done.stderr[-2000:]
    assert png.stat().st_size > 20_000, png.stat().st_size
    from PIL import Image

    with Image.open(png) as image:
        assert image.size == (1200, 1600)
        colours: Any = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is None or len(colours) > 50, "the screenshot is (nearly) one colour"
