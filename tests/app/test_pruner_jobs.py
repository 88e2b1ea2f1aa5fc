"""`prune` jobs with the pruners besides SliceGPT (magnitude, Wanda, SparseGPT, attention/MLP drop,
ShortGPT), run through a real RQ worker: stored under the right method name with the real fraction
of parameters removed, saved as stock transformers checkpoints."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, get_args

import pytest
import torch
from fastapi.testclient import TestClient
from transformers import AutoModelForCausalLM

from app.views.lm_eval import lm_eval_export
from core.methods import METHODS
from core.specs.pruning import StoredMethod
from core.tables import Job, Result
from tests.app.test_jobs_api import assert_problem
from tests.app.test_prune_jobs import job_results, prune_body, wait_done


def test_wanda_2_4_job_stores_its_pattern_in_the_method_and_saves_a_stock_checkpoint(
    api: TestClient, start_worker: Any, tiny_model_dir: Path
) -> None:
    worker = start_worker()
    job = api.post(
        "/v1/jobs", json=prune_body(str(tiny_model_dir), 0.5, method="wanda", pattern="2:4")
    ).json()
    done = wait_done(api, job["id"], worker)
    assert done["stage"] == "done"
    results = job_results(api, job["id"])
    assert set(results) == {"dense/ppl", "wanda-2:4/ppl", "wanda-2:4/param_fraction_removed"}
    pruned, dense = results["wanda-2:4/ppl"], results["dense/ppl"]
    assert math.isfinite(pruned["value"]) and pruned["value"] != dense["value"]
    assert pruned["protocol"]["pattern"] == "2:4" and pruned["protocol"]["pruning"]["method"] == "wanda"
    fraction = results["wanda-2:4/param_fraction_removed"]
    # Half of every pruned linear's weights, but embeddings, norms and head are kept.
    assert 0.05 < fraction["value"] < 0.5
    assert fraction["protocol"]["params_before"] - fraction["protocol"]["params_after"] == round(
        fraction["value"] * fraction["protocol"]["params_before"]
    )

    [artifact] = api.get(f"/v1/jobs/{job['id']}/artifacts").json()["items"]
    assert artifact["kind"] == "pruned-model"
    model = AutoModelForCausalLM.from_pretrained(artifact["path"])  # stock transformers, no helper
    weight = model.model.layers[0].mlp.down_proj.weight  # (out, in)
    groups = (weight == 0).reshape(weight.shape[0], -1, 4).sum(-1)
    assert torch.equal(groups, torch.full_like(groups, 2))


@pytest.mark.parametrize("method", ["shortgpt", "attention-drop"])
def test_layer_drop_jobs_record_the_dropped_layers_and_load_with_from_pretrained(
    api: TestClient, start_worker: Any, tiny_model_dir: Path, method: str
) -> None:
    worker = start_worker()
    dense_layers = AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.num_hidden_layers
    job = api.post("/v1/jobs", json=prune_body(str(tiny_model_dir), 0.5, method=method)).json()
    wait_done(api, job["id"], worker)
    fraction = job_results(api, job["id"])[f"{method}/param_fraction_removed"]
    dropped = fraction["protocol"]["dropped_layers"]
    assert len(dropped) == round(0.5 * dense_layers) and fraction["protocol"]["achieved_sparsity"] == 0.5
    [artifact] = api.get(f"/v1/jobs/{job['id']}/artifacts").json()["items"]
    model = AutoModelForCausalLM.from_pretrained(artifact["path"])
    expected_layers = dense_layers - len(dropped) if method == "shortgpt" else dense_layers
    assert model.config.num_hidden_layers == len(model.model.layers) == expected_layers
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[1, 2, 3, 4]])).logits
    assert torch.isfinite(logits).all()


def test_magnitude_job_needs_no_calibration_data(
    api: TestClient, start_worker: Any, tiny_model_dir: Path
) -> None:
    worker = start_worker()
    body = prune_body(str(tiny_model_dir), 0.3, method="magnitude", save_artifact=False)
    job = api.post("/v1/jobs", json=body).json()
    wait_done(api, job["id"], worker)
    pruned = job_results(api, job["id"])["magnitude/ppl"]
    assert pruned["protocol"]["calibration"] is None
    assert pruned["protocol"]["pruning"]["achieved_sparsity"] == pytest.approx(0.3, abs=0.02)


def test_every_stored_method_name_can_be_asked_for_in_curves_and_predictions() -> None:
    stored = {name for entry in METHODS.values() for name in entry.stored_names()}
    assert stored == set(get_args(StoredMethod))
    assert {"wanda-2:4", "sparsegpt-4:8", "magnitude", "shortgpt", "slicegpt-stock"} <= stored
    assert not any(name.startswith("shortgpt-") for name in stored)  # no N:M or layout for drops
    assert {name for name in stored if name.startswith("slicegpt")} == {"slicegpt", "slicegpt-stock"}


def test_lm_eval_export_of_a_2_4_prune_job_finds_its_rows_under_the_stored_method_name() -> None:
    job = Job(kind="prune", request={"method": "wanda", "pattern": "2:4", "sparsity": 0.5})
    rows = [
        Result(method="wanda-2:4", metric="acc", dataset="arc_easy", value=0.4, stderr=0.02, protocol={}),
        Result(method="dense", metric="acc", dataset="arc_easy", value=0.5, stderr=0.02, protocol={}),
    ]
    exported = lm_eval_export(job, rows)
    assert exported["results"]["arc_easy"]["acc,none"] == 0.4


def test_lm_eval_export_of_a_sweep_is_a_422_problem(api: TestClient, tiny_model_dir: Path) -> None:
    body = {"kind": "sweep", "model": str(tiny_model_dir), "method": "slicegpt", "sparsities": [0.1, 0.2]}
    job = api.post("/v1/jobs", json=body).json()
    problem = assert_problem(api.get(f"/v1/jobs/{job['id']}/results", params={"format": "lm-eval"}), 422)
    assert "stores one per sparsity" in problem["detail"]
