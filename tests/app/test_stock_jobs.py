"""`prune` jobs in the stock layout: stored apart from the per-layer layout, saved as a checkpoint that
plain transformers loads, which an `evaluate` job then scores like any model; families that cannot be
stock are refused at submit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.app.test_jobs_api import assert_problem
from tests.app.test_prune_jobs import job_results, prune_body, wait_done
from tests.app.test_sweep_jobs import items, sweep_body


def score_export(
    api: TestClient, worker: Any, artifact: Path, model_root: Path
) -> tuple[Path, dict[str, Any]]:
    """The artifact copied among the local models, as a user would place an export, and the ppl row
    an `evaluate` job measured on it (the prune jobs' perplexity protocol)."""
    export = model_root / f"export-{artifact.name}"
    shutil.copytree(artifact, export)
    evaluate = {"kind": "evaluate", "model": str(export), "perplexity": {"seqlen": 64, "max_windows": 2}}
    scored = api.post("/v1/jobs", json=evaluate).json()
    wait_done(api, scored["id"], worker)
    [row] = api.get(f"/v1/jobs/{scored['id']}/results").json()["items"]
    return export, row


def test_stock_prune_job_stores_slicegpt_stock_and_its_export_scores_alike_in_an_evaluate_job(
    api: TestClient, start_worker: Any, tiny_model_dir: Path, model_root: Path
) -> None:
    worker = start_worker()
    job = api.post("/v1/jobs", json=prune_body(str(tiny_model_dir), 0.25, layout="stock")).json()
    wait_done(api, job["id"], worker)
    results = job_results(api, job["id"])
    assert set(results) == {"dense/ppl", "slicegpt-stock/ppl", "slicegpt-stock/param_fraction_removed"}
    sliced = results["slicegpt-stock/ppl"]
    assert sliced["protocol"]["slicing"]["layout"] == "stock"
    assert sliced["protocol"]["slicing"]["pooling"] == "token"
    assert results["slicegpt-stock/param_fraction_removed"]["protocol"]["layout"] == "stock"
    assert api.get("/v1/results", params={"method": "slicegpt"}).json()["items"] == []  # kept apart

    [artifact] = api.get(f"/v1/jobs/{job['id']}/artifacts").json()["items"]
    assert artifact["kind"] == "sliced-model"
    model = AutoModelForCausalLM.from_pretrained(artifact["path"])  # no project code, no remote code
    assert model.config.hidden_size == 48 and type(model).__name__ == "LlamaForCausalLM"
    AutoTokenizer.from_pretrained(artifact["path"])  # the folder is a whole checkpoint

    export, row = score_export(api, worker, Path(artifact["path"]), model_root)
    assert row["method"] == "dense" and row["model"] == str(export)
    assert row["value"] == pytest.approx(sliced["value"], rel=1e-5)


def test_a_per_layer_artifact_is_scored_by_an_evaluate_job_with_prunecasts_own_loader(
    api: TestClient, start_worker: Any, tiny_model_dir: Path, model_root: Path
) -> None:
    worker = start_worker()
    job = api.post("/v1/jobs", json=prune_body(str(tiny_model_dir), 0.25)).json()
    wait_done(api, job["id"], worker)
    sliced = job_results(api, job["id"])["slicegpt/ppl"]
    [artifact] = api.get(f"/v1/jobs/{job['id']}/artifacts").json()["items"]
    export, row = score_export(api, worker, Path(artifact["path"]), model_root)
    assert row["value"] == pytest.approx(sliced["value"], rel=1e-5)
    refused = api.post("/v1/jobs", json=prune_body(str(export), 0.25))  # a sliced model is not sliced again
    assert_problem(refused, 422)


@pytest.mark.parametrize(
    "config",
    [
        {"model_type": "opt", "architectures": ["OPTForCausalLM"], "hidden_size": 64},
        {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 64},
    ],
)
def test_layernorm_families_in_the_stock_layout_are_refused_at_submit_with_the_reason(
    api: TestClient, model_root: Path, config: dict[str, Any]
) -> None:
    folder = model_root / f"stock-refused-{config['model_type']}"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    body = assert_problem(api.post("/v1/jobs", json=prune_body(str(folder), layout="stock")), 422)
    assert body["type"].endswith("/unsupported-architecture")
    assert "LayerNorm subtracts the mean" in body["detail"] and "layout 'per-layer'" in body["detail"]
    assert api.post("/v1/jobs", json=prune_body(str(folder))).status_code == 202  # per-layer slices it


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"method": "wanda", "sparsity": 0.5, "layout": "stock"}, "layout 'stock' is a slicegpt option"),
        ({"method": "wanda", "sparsity": 0.5, "layout": "per-layer"}, "is a slicegpt option"),
        ({"layout": "stock", "slice_head": False}, "leave slice_head null or true"),
        ({"layout": "rotated"}, "layout"),
    ],
)
def test_inconsistent_layouts_are_422s(
    api: TestClient, tiny_model_dir: Path, change: dict[str, Any], fragment: str
) -> None:
    body = assert_problem(api.post("/v1/jobs", json={**prune_body(str(tiny_model_dir)), **change}), 422)
    assert fragment in json.dumps(body)


def test_a_stock_sweep_stores_its_points_and_fit_under_slicegpt_stock(
    api: TestClient, start_worker: Any, tiny_model_dir: Path
) -> None:
    worker = start_worker()
    job = api.post("/v1/jobs", json=sweep_body(str(tiny_model_dir), [0.25, 0.5], layout="stock")).json()
    wait_done(api, job["id"], worker)
    points = [p for p in items(api, f"/v1/jobs/{job['id']}/results") if p["metric"] == "ppl"]
    assert sorted((p["method"], p["sparsity"]) for p in points) == [
        ("dense", 0.0),
        ("slicegpt-stock", 0.25),
        ("slicegpt-stock", 0.5),
    ]
    assert {p["protocol"]["slicing"]["width"] for p in points if p["sparsity"] > 0} == {48, 32}
    [fit] = items(api, "/v1/fits", job_id=job["id"], metric="ppl")
    assert fit["method"] == "slicegpt-stock"
    assert items(api, "/v1/fits", model=str(tiny_model_dir), method="slicegpt", metric="ppl") == []


def test_a_stock_sweep_request_is_validated_like_a_prune() -> None:
    from core.specs.jobs import SweepJobCreate

    body = {"kind": "sweep", "model": "m", "method": "slicegpt", "sparsities": [0.1], "layout": "stock"}
    assert SweepJobCreate.model_validate(body).layout == "stock"
    with pytest.raises(ValueError, match="slice_head null or true"):
        SweepJobCreate.model_validate({**body, "slice_head": False})
