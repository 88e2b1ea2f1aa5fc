"""`probe` jobs over HTTP through a real RQ worker: the pruned model made in the job or read from an
earlier prune job's artifact, its probe points queryable and its plots rendering."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.app.test_prune_jobs import job_results, prune_body, wait_done

SMALL_CALIBRATION = {"num_sequences": 4, "seqlen": 32, "batch_size": 2}
PROMPTS = [
    {
        "text": "Question: which is a fruit? A. stone B. apple C. chair D. road\nAnswer:",
        "options": ["A", "B", "C", "D"],
    },
    {"text": "12 + 30 ="},
    {"text": "Once upon a time, in a quiet village by the sea,"},
]


def probe_body(model: str, **overrides: Any) -> dict[str, Any]:
    return {
        "kind": "probe",
        "model": model,
        "method": "wanda",
        "sparsity": 0.5,
        "calibration": SMALL_CALIBRATION,
        "prompts": PROMPTS,
        "generation": {"max_new_tokens": 6},
        **overrides,
    }


def all_points(api: TestClient, job_id: str, **filters: Any) -> list[dict[str, Any]]:
    points: list[dict[str, Any]] = []
    cursor = None
    while True:
        params = {**filters, "limit": 200, **({"cursor": cursor} if cursor else {})}
        page = api.get(f"/v1/jobs/{job_id}/probes", params=params)
        assert page.status_code == 200, page.text
        body = page.json()
        points += body["items"]
        cursor = body["next_cursor"]
        if not cursor:
            return points


def test_probe_job_with_wanda_stores_every_probe_and_its_plots_render(
    api: TestClient, start_worker: Any, tiny_model_dir: Path
) -> None:
    worker = start_worker()
    body = probe_body(str(tiny_model_dir), generation={"max_new_tokens": 6, "counterfactual_steps": 2})
    job = api.post("/v1/jobs", json=body).json()
    assert job["kind"] == "probe"
    done = wait_done(api, job["id"], worker)
    assert done["stage"] == "done" and done["progress"] == 1.0

    points = all_points(api, job["id"])
    probes = {point["probe"] for point in points}
    assert probes == {
        "model",
        "counterfactual",
        "generation-greedy",
        "generation-sampled",
        "generation-teacher-forced",
        "mc-subspace",
    }
    layers = {p["layer"] for p in points if p["probe"] == "counterfactual"}
    assert layers == {0, 1}  # the tiny model's two blocks
    # prompt points (no step) and the first two decoding steps of the dense model's generation
    assert {p["step"] for p in points if p["probe"] == "counterfactual"} == {None, 0, 1}
    forced = {p["step"] for p in points if p["probe"] == "generation-teacher-forced"}
    assert forced == {0, 1}
    prompt_points = [p for p in points if p["probe"] == "counterfactual" and p["step"] is None]
    assert all(p["n"] >= 2 and p["value_min"] <= p["value"] <= p["value_max"] for p in prompt_points)
    assert all(p["stderr"] is not None for p in prompt_points)
    kl = [p for p in points if p["probe"] == "counterfactual" and p["metric"] == "kl"]
    assert kl and all(p["value"] >= 0 and p["estimate"] is not None for p in kl)
    assert all(math.isfinite(p["value"]) for p in points)
    steps = {p["step"] for p in points if p["probe"] == "generation-greedy" and p["space"] == "tokens"}
    assert steps == set(range(6))

    only_kl = all_points(api, job["id"], probe="counterfactual", metric="kl", space="probs")
    assert sorted(p["id"] for p in only_kl) == sorted(p["id"] for p in kl)

    [cost] = [r for r in job_results(api, job["id"]).values() if r["metric"] == "probe_cost_multiple"]
    assert cost["method"] == "wanda" and cost["value"] > 0 and cost["n"] == len(points)
    assert cost["protocol"]["prompts"] == 3 and cost["protocol"]["skipped"] == {}
    assert cost["protocol"]["measuring_points"]["attention"].startswith("attention sublayer output")
    assert cost["protocol"]["cost_multiples"]["decoding_steps"] > 0

    for view in ("layers", "heatmap", "generation"):
        svg = api.get(f"/v1/jobs/{job['id']}/probes/plot.svg", params={"view": view})
        assert svg.status_code == 200 and svg.headers["content-type"].startswith("image/svg+xml"), view
        assert ElementTree.fromstring(svg.content).tag.endswith("svg")
    png = api.get(f"/v1/jobs/{job['id']}/probes/plot.png", params={"view": "layers"})
    assert png.status_code == 200 and png.content.startswith(b"\x89PNG")
    report = api.get(f"/v1/jobs/{job['id']}/report")
    assert report.status_code == 200 and report.text.count("<svg") >= 3


def test_released_code_probe_reads_decoding_steps_at_its_own_temperature_and_keeps_apart(
    api: TestClient, start_worker: Any, tiny_model_dir: Path
) -> None:
    worker = start_worker()
    body = probe_body(str(tiny_model_dir), convention="released-code", generation={"max_new_tokens": 3})
    job = api.post("/v1/jobs", json=body).json()
    assert job["request"]["temperature"] == 0.5  # the convention's default, stored with the request
    done = wait_done(api, job["id"], worker)
    assert done["status"] == "succeeded", done.get("error")

    points = all_points(api, job["id"])
    assert {p["convention"] for p in points} == {"released-code"}
    # only the last token of each decoding step: no prompt points, every generated step
    assert {p["step"] for p in points if p["probe"] == "counterfactual"} == {0, 1, 2}
    assert {"alpha", "dpar", "dperp"} <= {p["metric"] for p in points if p["space"] == "logits"}
    spaces = {p["space"] for p in points if p["probe"] == "mc-subspace"}
    assert spaces == {"probs", "options", "option-letters"}
    summary = api.get(f"/v1/jobs/{job['id']}/probes").json()["summary"]
    assert summary and {row["convention"] for row in summary} == {"released-code"}

    [cost] = [r for r in job_results(api, job["id"]).values() if r["metric"] == "probe_cost_multiple"]
    protocol = cost["protocol"]
    assert protocol["convention"] == "released-code" and protocol["temperature"] == 0.5
    assert protocol["convention_rules"]["sublayer_reference"] == "pruned"
    assert "counterfactual on prompts" in protocol["skipped"]
    svg = api.get(f"/v1/jobs/{job['id']}/probes/plot.svg", params={"view": "layers"})
    assert svg.status_code == 200  # the decoding steps' mean per layer: no prompt points to draw
    report = api.get(f"/v1/jobs/{job['id']}/report")
    assert report.status_code == 200 and "counterfactual (decoding steps) [released-code]" in report.text


def test_probe_job_reads_a_shortgpt_artifact_and_measures_the_removed_block_as_identity(
    api: TestClient, start_worker: Any, tiny_model_dir: Path
) -> None:
    worker = start_worker()
    pruned = api.post("/v1/jobs", json=prune_body(str(tiny_model_dir), 0.5, method="shortgpt")).json()
    wait_done(api, pruned["id"], worker)
    dropped = job_results(api, pruned["id"])["shortgpt/param_fraction_removed"]["protocol"]["dropped_layers"]

    body = probe_body(str(tiny_model_dir), artifact_job_id=pruned["id"], generation=None)
    for key in ("method", "sparsity", "calibration"):
        body.pop(key)
    job = api.post("/v1/jobs", json=body).json()
    wait_done(api, job["id"], worker)
    counterfactual = all_points(api, job["id"], probe="counterfactual")
    # Only whole blocks were removed: no attention or MLP swaps. On the dense input a kept block is
    # the dense block (exactly 0); a removed one is the identity, which bends the stream.
    assert {p["sublayer"] for p in counterfactual} == {"block"}
    bend = {
        p["layer"]: p["value"] for p in counterfactual if p["metric"] == "1-cos" and p["space"] == "embedding"
    }
    assert set(bend) == {0, 1} and all((bend[layer] > 0) == (layer in dropped) for layer in bend)
    assert not all_points(api, job["id"], probe="generation-greedy")
    [cost] = [r for r in job_results(api, job["id"]).values() if r["metric"] == "probe_cost_multiple"]
    assert cost["method"] == "shortgpt" and cost["protocol"]["origin"]["artifact_job_id"] == pruned["id"]
    assert "generation" in cost["protocol"]["skipped"]


@pytest.mark.parametrize(("layout", "stored"), [(None, "slicegpt"), ("stock", "slicegpt-stock")])
def test_probe_of_a_sliced_model_compares_whole_blocks_through_its_bases(
    api: TestClient, start_worker: Any, tiny_model_dir: Path, layout: str | None, stored: str
) -> None:
    worker = start_worker()
    body = probe_body(str(tiny_model_dir), method="slicegpt", sparsity=0.25, generation=None, layout=layout)
    job = api.post("/v1/jobs", json=body).json()
    wait_done(api, job["id"], worker)
    counterfactual = all_points(api, job["id"], probe="counterfactual")
    assert {p["sublayer"] for p in counterfactual} == {"block"}
    assert {p["layer"] for p in counterfactual} == {0, 1}
    assert {p["space"] for p in counterfactual} == {"embedding", "logits", "probs"}
    assert all(p["value"] > 0 for p in counterfactual if p["metric"] == "kl")
    assert {p["space"] for p in all_points(api, job["id"], probe="model")} >= {"logits", "probs"}
    [cost] = [r for r in job_results(api, job["id"]).values() if r["metric"] == "probe_cost_multiple"]
    assert cost["method"] == stored
    assert "whole" in cost["protocol"]["skipped"]["counterfactual sublayers"]


def test_options_that_share_their_first_token_fail_the_probe_before_any_pruning(
    api: TestClient, start_worker: Any, tiny_model_dir: Path
) -> None:
    worker = start_worker()
    body = probe_body(str(tiny_model_dir), prompts=[{"text": "Pick one:", "options": ["10", "100"]}])
    job = api.post("/v1/jobs", json=body).json()
    done = api.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 120}).json()
    assert done["status"] == "failed", worker.output()[-2000:]
    assert done["error"].startswith("prompts[0]: options ('10', '100') do not start with distinct tokens")
    assert "give options that differ in their first token" in done["error"]
    assert done["progress"] < 0.05  # refused before the second copy was pruned
    assert not all_points(api, job["id"])
