"""GET /v1/jobs/{id}/probes/plot.svg|png: the layers, heatmap and generation views of a probe job,
and the probe section of the job's report."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

import pytest
from fastapi.testclient import TestClient

from core.store import Store
from tests.app.store_points import add_job
from tests.app.store_probes import add_probe_points, counterfactual_points, probe_job
from tests.app.test_jobs_api import assert_problem

SVG_NS = "{http://www.w3.org/2000/svg}"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
UNKNOWN_JOB = "00000000-0000-7000-8000-000000000000"


def svg_ids(svg: str) -> list[str]:
    root = ET.fromstring(svg.encode())
    assert root.tag == f"{SVG_NS}svg"
    return [element.attrib["id"] for element in root.iter() if "id" in element.attrib]


def plot(api: TestClient, job_id: str, fmt: str = "svg", **params: Any) -> Any:
    return api.get(f"/v1/jobs/{job_id}/probes/plot.{fmt}", params=params)


def test_layers_view_draws_truth_and_estimate_per_space_with_a_log_axis(
    api: TestClient, clean_store: Store
) -> None:
    seeded = probe_job(clean_store)
    response = plot(api, seeded.job_id)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("image/svg+xml")
    ids = svg_ids(response.text)
    panels = [i for i in ids if i.startswith("panel-")]
    assert panels == ["panel-embedding-1-cos", "panel-logits-1-cos", "panel-probs-1-cos", "panel-probs-kl"]
    truths = [i for i in ids if i.startswith("truth-")]
    estimates = [i for i in ids if i.startswith("estimate-")]
    assert len(truths) == 4 and len(estimates) == 4
    # The seeded values grow 10^0.8 per layer: over four layers they span decades, hence log axes.
    assert response.text.count(">1-cos (log scale)</text>") == 3 and ">kl (log scale)</text>" in response.text
    flat = probe_job(clean_store, layers=2)  # 10^0.8 apart: one decade at most, a linear axis
    assert "(log scale)" not in plot(api, flat.job_id).text


def test_layers_view_of_one_sublayer_and_metric(api: TestClient, clean_store: Store) -> None:
    seeded = probe_job(clean_store)
    ids = svg_ids(plot(api, seeded.job_id, sublayer="attention", metric="kl").text)
    assert [i for i in ids if i.startswith("panel-")] == ["panel-probs-kl"]
    assert_problem(plot(api, seeded.job_id, sublayer="block", metric="nope", probe="model"), 404)


def test_heatmap_view_draws_layers_by_steps(api: TestClient, clean_store: Store) -> None:
    seeded = probe_job(clean_store, layers=5, steps=7)
    for probe in (None, "generation-sampled"):
        params = {"view": "heatmap", **({"probe": probe} if probe else {})}
        response = plot(api, seeded.job_id, **params)
        assert response.status_code == 200, response.text
        ids = svg_ids(response.text)
        assert [i for i in ids if i.startswith("panel-")] == ["panel-heatmap"]
        assert "<image" in response.text
    assert_problem(plot(api, seeded.job_id, view="heatmap", probe="counterfactual"), 404)


def test_generation_view_draws_kl_cos_and_token_agreement_for_both_runs(
    api: TestClient, clean_store: Store
) -> None:
    seeded = probe_job(clean_store)
    ids = svg_ids(plot(api, seeded.job_id, view="generation").text)
    assert [i for i in ids if i.startswith("panel-")] == [
        "panel-generation-kl",
        "panel-generation-1-cos",
        "panel-generation-tokens",
    ]
    lines = [i for i in ids if i.startswith("generation-")]
    assert len(lines) == 2 + 6 + 4  # KL: 2 runs; 1-cos: 3 spaces x 2 runs; agree, prefix_agree x 2 runs
    assert "generation-greedy-tokens-prefix_agree" in lines and "generation-sampled-probs-kl" in lines


@pytest.mark.parametrize("view", ["layers", "heatmap", "generation"])
def test_png_plots_are_pngs(api: TestClient, clean_store: Store, view: str) -> None:
    seeded = probe_job(clean_store, layers=3, steps=3)
    response = plot(api, seeded.job_id, "png", view=view)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "image/png"
    assert response.content.startswith(PNG_MAGIC) and len(response.content) > 5_000


@pytest.mark.parametrize("fmt", ["svg", "png"])
@pytest.mark.parametrize("view", ["layers", "heatmap", "generation"])
def test_plots_of_an_unknown_job_or_a_job_without_points_are_404(
    api: TestClient, clean_store: Store, fmt: str, view: str
) -> None:
    problem = assert_problem(plot(api, UNKNOWN_JOB, fmt, view=view), 404)
    assert problem["type"].endswith("/job-not-found")
    empty = add_job(clean_store, "m", kind="probe")
    problem = assert_problem(plot(api, empty, fmt, view=view), 404)
    assert problem["type"].endswith("/probe-points-not-found") and view in problem["detail"]


def test_bad_plot_queries_are_422(api: TestClient, clean_store: Store) -> None:
    seeded = probe_job(clean_store, layers=2, steps=2)
    for params in ({"view": "pie"}, {"sublayer": "head"}, {"probe": "x"}, {"metric": ""}):
        assert_problem(plot(api, seeded.job_id, **params), 422)


def test_plot_escapes_the_model_name(api: TestClient, clean_store: Store) -> None:
    evil = '<script>alert("x")</script>$x$'
    job_id = add_job(clean_store, evil, kind="probe", method="magnitude", sparsity=0.5)
    add_probe_points(clean_store, job_id, counterfactual_points(3))
    svg = plot(api, job_id).text
    svg_ids(svg)  # still well-formed XML
    assert "<script" not in svg and "&lt;script&gt;" in svg


def test_report_shows_the_probe_summary_and_three_plots(api: TestClient, clean_store: Store) -> None:
    seeded = probe_job(clean_store)
    page = api.get(f"/v1/jobs/{seeded.job_id}/report").text
    section = page[page.index('<section id="probes">') :]
    assert "No probes" not in section and 'id="probe-summary"' in section
    assert section.count("<svg") == 3
    for start in [m.start() for m in re.finditer("<svg", section)]:
        ET.fromstring(section[start : section.index("</svg>", start) + len("</svg>")])
    summary = api.get(f"/v1/jobs/{seeded.job_id}/probes").json()["summary"]
    first = summary[0]
    assert f"{first['correlation']:.4g}" in section
    assert section.count("<tr>") == 1 + len(summary)
    assert "<script" not in page


def test_report_of_a_job_with_only_counterfactual_points_says_what_is_missing(
    api: TestClient, clean_store: Store
) -> None:
    job_id = add_job(clean_store, "m", kind="probe", method="shortgpt", sparsity=0.25)
    add_probe_points(clean_store, job_id, counterfactual_points(3))
    section = api.get(f"/v1/jobs/{job_id}/report").text.split('<section id="probes">')[1]
    assert section.count("<svg") == 1 and "no probe points for view &#x27;heatmap&#x27;" in section


def test_report_without_probe_points_keeps_the_placeholder(api: TestClient, clean_store: Store) -> None:
    job_id = add_job(clean_store, "m", kind="probe", method="wanda", sparsity=0.5)
    page = api.get(f"/v1/jobs/{job_id}/report").text
    section = page[page.index('<section id="probes">') :]
    assert "No probes" in section and "<svg" not in section
