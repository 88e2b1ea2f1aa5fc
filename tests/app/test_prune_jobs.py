"""`prune` jobs with `method: slicegpt`: validated and refused at submit, run through a real RQ
worker on Postgres + Redis, measured against a dense baseline stored once, saved as an artifact."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from transformers import AutoTokenizer

from core.settings import Settings
from tests.app.test_jobs_api import assert_problem
from workers.data import load_wikitext2_test, tokenize_corpus
from workers.evaluation.perplexity import perplexity
from workers.slicing.artifacts import load_sliced

CALIBRATION_TEXT = "Calibration text about rivers, hills and the towns between them. " * 8  # > 32 tokens


def prune_body(model: str, sparsity: float = 0.25, **overrides: Any) -> dict[str, Any]:
    return {
        "kind": "prune",
        "model": model,
        "method": "slicegpt",
        "sparsity": sparsity,
        "calibration": {"num_sequences": 4, "seqlen": 32, "batch_size": 2},
        "perplexity": {"seqlen": 64, "max_windows": 2},
        **overrides,
    }


def wait_done(api: TestClient, job_id: str, worker: Any) -> dict[str, Any]:
    done: dict[str, Any] = api.get(f"/v1/jobs/{job_id}/wait", params={"timeout": 120}).json()
    assert done["status"] == "succeeded", (done, worker.output()[-4000:])
    return done


def log_entries(output: str) -> list[dict[str, Any]]:
    entries = []
    for line in output.splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict):
                entries.append(entry)
    return entries


def job_results(api: TestClient, job_id: str) -> dict[str, dict[str, Any]]:
    items = api.get(f"/v1/jobs/{job_id}/results").json()["items"]
    return {f"{item['method']}/{item['metric']}": item for item in items}


def test_prune_jobs_run_through_a_real_rq_worker_and_measure_the_dense_baseline_once(
    api: TestClient, start_worker: Any, tiny_model_dir: Path, rq_settings: Settings
) -> None:
    worker = start_worker()
    first = api.post("/v1/jobs", json=prune_body(str(tiny_model_dir), 0.25)).json()
    assert first["kind"] == "prune" and first["links"]["artifacts"] == f"/v1/jobs/{first['id']}/artifacts"
    done = wait_done(api, first["id"], worker)
    assert done["stage"] == "done" and done["progress"] == 1.0

    results = job_results(api, first["id"])
    assert set(results) == {"dense/ppl", "slicegpt/ppl", "slicegpt/param_fraction_removed"}
    sliced, dense, fraction = (
        results["slicegpt/ppl"],
        results["dense/ppl"],
        results["slicegpt/param_fraction_removed"],
    )
    assert sliced["sparsity"] == 0.25 and dense["sparsity"] == 0.0 and sliced["dataset"] == "wikitext2"
    assert math.isfinite(sliced["value"]) and sliced["value"] > 1
    protocol = sliced["protocol"]
    assert protocol["seqlen"] == 64 and protocol["windows"] == 2 and protocol["dtype"] == "float32"
    assert protocol["dense_result_id"] == dense["id"] and protocol["dense_reused"] is False
    assert protocol["calibration"]["corpus"] == "boolq-passages"
    assert protocol["calibration"]["num_sequences"] == 4 and protocol["calibration"]["seqlen"] == 32
    assert protocol["calibration"]["seed"] == 42 and len(protocol["calibration"]["data_sha256"]) == 64
    slicing = protocol["slicing"]
    assert slicing["family"] == "llama" and slicing["width"] == 48 and slicing["hidden_size"] == 64
    assert len(slicing["timings"]["blocks"]) == 2 and protocol["timings"]["slicing_s"] >= 0
    assert protocol["torch"] and protocol["transformers"]
    assert fraction["value"] == slicing["param_fraction_removed"]
    assert fraction["value"] == pytest.approx(1 - slicing["params_after"] / slicing["params_before"])
    queried = api.get("/v1/results", params={"method": "slicegpt", "metric": "ppl"}).json()["items"]
    assert [item["id"] for item in queried] == [sliced["id"]]
    # The worker logs every stage change; slicing reports its position as "block i/L".
    assert any(
        entry.get("stage") == "slicing" and re.fullmatch(r"block \d/2", entry.get("detail") or "")
        for entry in log_entries(worker.output())
    )

    # The artifact: listed, hashed, and it reloads to the very model that was scored.
    artifacts = api.get(f"/v1/jobs/{first['id']}/artifacts").json()["items"]
    assert len(artifacts) == 1
    artifact = artifacts[0]
    folder = Path(artifact["path"])
    assert artifact["kind"] == "sliced-model" and folder == rq_settings.artifacts_dir / first["id"]
    assert artifact["sha256"] == hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
    assert artifact["bytes"] == sum(path.stat().st_size for path in folder.iterdir())
    assert json.loads((folder / "slicing_config.json").read_text())["calibration"]["num_sequences"] == 4
    reloaded = load_sliced(folder)
    eval_ids = tokenize_corpus(
        AutoTokenizer.from_pretrained(tiny_model_dir.resolve()),
        load_wikitext2_test(rq_settings),
        settings=rq_settings,
    )
    with torch.no_grad():
        rescored = perplexity(reloaded, eval_ids, seqlen=64, max_windows=2)
    assert rescored.ppl == pytest.approx(sliced["value"], rel=1e-5)

    # A second job at another sparsity, calibrated on the request's own text, reuses the baseline.
    calibration = {"corpus": "text", "text": CALIBRATION_TEXT, "num_sequences": 4, "seqlen": 32, "seed": 3}
    body = prune_body(str(tiny_model_dir), 0.5, calibration=calibration, save_artifact=False)
    second = api.post("/v1/jobs", json=body).json()
    wait_done(api, second["id"], worker)
    second_results = job_results(api, second["id"])
    assert set(second_results) == {"slicegpt/ppl", "slicegpt/param_fraction_removed"}
    second_protocol = second_results["slicegpt/ppl"]["protocol"]
    assert second_protocol["dense_result_id"] == dense["id"] and second_protocol["dense_reused"] is True
    assert second_protocol["calibration"]["corpus"] == "user-text" and second_protocol["artifact"] is None
    assert second_protocol["slicing"]["width"] == 32
    assert second_results["slicegpt/param_fraction_removed"]["value"] > fraction["value"]
    dense_results = api.get("/v1/results", params={"method": "dense", "metric": "ppl"}).json()["items"]
    assert [item["id"] for item in dense_results] == [dense["id"]]
    assert api.get(f"/v1/jobs/{second['id']}/artifacts").json()["items"] == []


def test_a_gemma3_model_is_sliced_per_layer_and_refused_in_the_stock_layout(
    api: TestClient, start_worker: Any, model_root: Path, rq_settings: Settings
) -> None:
    from tests.tiny_models import build_tiny_causal_lm

    model = build_tiny_causal_lm(model_root / "tiny-gemma3-sliced", "gemma3_text")
    stock = assert_problem(api.post("/v1/jobs", json=prune_body(str(model), layout="stock")), 422)
    assert "normalise each branch's output" in stock["detail"] and "per-layer" in stock["detail"]
    worker = start_worker()
    job = api.post("/v1/jobs", json=prune_body(str(model), 0.25))
    assert job.status_code == 202, job.text
    wait_done(api, job.json()["id"], worker)
    results = job_results(api, job.json()["id"])
    slicing = results["slicegpt/ppl"]["protocol"]["slicing"]
    assert slicing["family"] == "gemma" and slicing["width"] == 48
    assert slicing["params_after"] == slicing["predicted_params_after"]
    [artifact] = api.get(f"/v1/jobs/{job.json()['id']}/artifacts").json()["items"]
    reloaded = load_sliced(Path(artifact["path"]))
    eval_ids = tokenize_corpus(
        AutoTokenizer.from_pretrained(model), load_wikitext2_test(rq_settings), settings=rq_settings
    )
    with torch.no_grad():
        rescored = perplexity(reloaded, eval_ids, seqlen=64, max_windows=2)
    assert rescored.ppl == pytest.approx(results["slicegpt/ppl"]["value"], rel=1e-5)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"sparsity": 1.0}, "sparsity"),
        ({"sparsity": -0.1}, "sparsity"),
        ({"method": "magic"}, "method"),
        ({"round_to": 0}, "round_to"),
        ({"calibration": {"corpus": "text"}}, "calibration"),
        ({"calibration": {"text": "only read for corpus text"}}, "calibration"),
        ({"calibration": {"corpus": "wikitext2-test"}}, "corpus"),
        ({"calibration": {"num_sequences": 0}}, "num_sequences"),
    ],
)
def test_invalid_prune_request_is_a_422_naming_the_field(
    api: TestClient, tiny_model_dir: Path, change: dict[str, Any], field: str
) -> None:
    body = assert_problem(api.post("/v1/jobs", json={**prune_body(str(tiny_model_dir)), **change}), 422)
    assert any(field in error["loc"] for error in body["errors"]), body


def test_prune_without_method_is_refused(api: TestClient, tiny_model_dir: Path) -> None:
    body = prune_body(str(tiny_model_dir))
    del body["method"]
    assert_problem(api.post("/v1/jobs", json=body), 422)


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ({"model_type": "bloom", "architectures": ["BloomForCausalLM"]}, "no adapter recognises"),
        ({"model_type": "olmo2", "architectures": ["Olmo2ForCausalLM"]}, "no norm before attention"),
    ],
)
def test_unsupported_architecture_is_refused_at_submit_naming_the_supported_families(
    api: TestClient, model_root: Path, config: dict[str, Any], fragment: str
) -> None:
    folder = model_root / f"unsupported-{config['model_type']}"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**config, "hidden_size": 64}))
    body = assert_problem(api.post("/v1/jobs", json=prune_body(str(folder))), 422)
    assert body["type"].endswith("/unsupported-architecture")
    assert fragment in body["detail"]
    assert "Supported families: llama (LlamaForCausalLM" in body["detail"]
    assert api.get("/v1/jobs").json()["items"] == []


def test_sparsity_that_leaves_no_dimension_is_refused_at_submit(
    api: TestClient, tiny_model_dir: Path
) -> None:
    # D = 64: (1 - 0.9) * 64 = 6.4 -> 6, rounded down to a multiple of 8 -> 0.
    body = assert_problem(api.post("/v1/jobs", json=prune_body(str(tiny_model_dir), 0.9)), 422)
    assert body["type"].endswith("/invalid-sparsity") and "leaves no dimension" in body["detail"]
    accepted = api.post("/v1/jobs", json=prune_body(str(tiny_model_dir), 0.9, round_to=1))
    assert accepted.status_code == 202, accepted.text


def test_artifacts_of_an_unknown_job_is_404(api: TestClient) -> None:
    assert_problem(api.get("/v1/jobs/00000000-0000-0000-0000-000000000000/artifacts"), 404)


def test_prune_request_is_documented_in_openapi(api: TestClient) -> None:
    schemas = api.get("/openapi.json").json()["components"]["schemas"]
    prune = schemas["PruneJobCreate"]["properties"]
    assert prune["method"].get("enum", [prune["method"].get("const")])[0] == "slicegpt"
    assert "residual width" in prune["sparsity"]["description"]
    calibration = schemas["CalibrationSpec"]["properties"]
    assert calibration["num_sequences"]["default"] == 128 and calibration["seqlen"]["default"] == 2048
    assert "ArtifactList" in schemas
