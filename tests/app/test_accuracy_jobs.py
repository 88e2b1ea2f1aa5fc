"""Accuracy in jobs: `evaluate` and `prune` jobs with multiple-choice tasks, run through a real RQ
worker on the tiny Llama, stored per task and metric, exported in lm-evaluation-harness's format,
the dense accuracy reused across prune jobs, and predictions made from the stored results."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient

from core.specs.common import ACCURACY_TASKS
from tests.app.test_jobs_api import assert_problem
from tests.app.test_prune_jobs import prune_body, wait_done
from workers.evaluation.generative_tasks import TASKS as GENERATIVE_TASKS
from workers.evaluation.mc_formats import task_names

TASKS = ["arc_easy", "winogrande"]
ACCURACY = {"tasks": TASKS, "limit": 4, "batch_size": 8}


def evaluate_body(model: str, **overrides: Any) -> dict[str, Any]:
    return {"kind": "evaluate", "model": model, "perplexity": None, "accuracy": ACCURACY, **overrides}


def by_task_and_metric(items: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(item["dataset"], item["metric"]): item for item in items}


def test_schema_task_names_are_the_worker_registries() -> None:
    assert set(task_names()) | set(GENERATIVE_TASKS) == set(ACCURACY_TASKS)


def test_evaluate_job_with_tasks_stores_acc_and_acc_norm_per_task_and_exports_lm_eval(
    api: TestClient, start_worker: Any, tiny_model_dir: Path
) -> None:
    worker = start_worker()
    job = api.post("/v1/jobs", json=evaluate_body(str(tiny_model_dir)))
    assert job.status_code == 202, job.text
    job_id = job.json()["id"]
    wait_done(api, job_id, worker)

    acc = api.get("/v1/results", params={"metric": "acc", "job_id": job_id}).json()["items"]
    norm = api.get("/v1/results", params={"metric": "acc_norm", "job_id": job_id}).json()["items"]
    rows = by_task_and_metric(acc + norm)
    # WinoGrande's partial scoring defines no acc_norm (as in lm-eval).
    assert set(rows) == {("arc_easy", "acc"), ("arc_easy", "acc_norm"), ("winogrande", "acc")}
    assert not api.get("/v1/results", params={"metric": "ppl", "job_id": job_id}).json()["items"]
    for (task, _), row in rows.items():
        assert row["method"] == "dense" and row["sparsity"] == 0.0 and row["n"] == 4
        assert 0.0 <= row["value"] <= 1.0 and row["stderr"] is not None and row["stderr"] >= 0.0
        protocol = row["protocol"]
        assert protocol["task"] == task and protocol["limit"] == 4 and protocol["num_fewshot"] == 0
        assert len(protocol["data_sha256"]) == 64 and protocol["torch"] and protocol["transformers"]
        assert protocol["dtype"] == "float32"
    assert (
        rows[("arc_easy", "acc")]["split"] == "test" and rows[("winogrande", "acc")]["split"] == "validation"
    )
    assert rows[("winogrande", "acc")]["protocol"]["chance"] == 0.5
    assert 0.2 <= rows[("arc_easy", "acc")]["protocol"]["chance"] <= 0.34

    exported = api.get(f"/v1/jobs/{job_id}/results", params={"format": "lm-eval"})
    assert exported.status_code == 200, exported.text
    doc = exported.json()
    arc = doc["results"]["arc_easy"]
    assert arc["alias"] == "arc_easy" and arc["acc,none"] == rows[("arc_easy", "acc")]["value"]
    assert arc["acc_stderr,none"] == rows[("arc_easy", "acc")]["stderr"]
    assert arc["acc_norm,none"] == rows[("arc_easy", "acc_norm")]["value"] and "acc_norm_stderr,none" in arc
    assert set(doc["results"]["winogrande"]) == {"alias", "acc,none", "acc_stderr,none"}
    assert set(doc["configs"]) == set(TASKS) and set(doc["versions"]) == set(TASKS)
    assert doc["n-samples"]["arc_easy"]["effective"] == 4
    assert doc["config"]["model"] == "hf" and doc["config"]["limit"] == 4 and doc["config"]["batch_size"] == 8
    assert f"pretrained={doc['model_name']}" in doc["config"]["model_args"]
    assert doc["prunecast"]["job_id"] == job_id and doc["prunecast"]["method"] == "dense"
    assert doc["prunecast"]["sparsity"] == 0.0
    # The default format is unchanged: the list of stored results.
    assert len(api.get(f"/v1/jobs/{job_id}/results").json()["items"]) == 3


def test_unknown_export_format_is_a_422_problem(api: TestClient, tiny_model_dir: Path) -> None:
    job_id = api.post("/v1/jobs", json=evaluate_body(str(tiny_model_dir))).json()["id"]
    body = assert_problem(api.get(f"/v1/jobs/{job_id}/results", params={"format": "csv"}), 422)
    assert any("format" in error["loc"] for error in body["errors"]), body


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"accuracy": {"tasks": ["mmlu"]}}, "tasks"),
        ({"accuracy": {"tasks": []}}, "tasks"),
        ({"accuracy": {"tasks": ["piqa", "piqa"]}}, "tasks"),
        ({"accuracy": {"tasks": ["piqa"], "limit": 0}}, "limit"),
        ({"accuracy": {"tasks": ["piqa"], "num_fewshot": 26}}, "num_fewshot"),
        ({"accuracy": None}, "must measure something"),
    ],
)
def test_invalid_accuracy_request_is_a_422_naming_the_field(
    api: TestClient, tiny_model_dir: Path, change: dict[str, Any], field: str
) -> None:
    body = assert_problem(api.post("/v1/jobs", json=evaluate_body(str(tiny_model_dir), **change)), 422)
    assert field in str(body), body


def test_evaluate_without_accuracy_still_measures_perplexity_by_default(
    api: TestClient, tiny_model_dir: Path
) -> None:
    job = api.post("/v1/jobs", json={"kind": "evaluate", "model": str(tiny_model_dir)}).json()
    assert job["request"]["perplexity"]["seqlen"] == 2048 and job["request"]["accuracy"] is None


def test_prune_with_accuracy_stores_dense_and_pruned_acc_reuses_the_dense_and_predicts(
    api: TestClient, start_worker: Any, tiny_model_dir: Path
) -> None:
    worker = start_worker()
    accuracy = {"tasks": ["arc_easy"], "limit": 4}
    first = api.post("/v1/jobs", json=prune_body(str(tiny_model_dir), 0.25, accuracy=accuracy)).json()
    wait_done(api, first["id"], worker)
    rows = api.get(f"/v1/jobs/{first['id']}/results").json()["items"]
    found = {(row["method"], row["metric"]): row for row in rows if row["dataset"] == "arc_easy"}
    assert set(found) == {(m, k) for m in ("dense", "slicegpt") for k in ("acc", "acc_norm")}
    pruned, dense = found[("slicegpt", "acc")], found[("dense", "acc")]
    assert pruned["sparsity"] == 0.25 and dense["sparsity"] == 0.0 and pruned["n"] == 4
    assert (
        pruned["protocol"]["dense_result_id"] == dense["id"] and pruned["protocol"]["dense_reused"] is False
    )
    assert pruned["protocol"]["dense_value"] == dense["value"] and pruned["protocol"]["width"] == 48
    assert pruned["protocol"]["data_sha256"] == dense["protocol"]["data_sha256"]
    doc = api.get(f"/v1/jobs/{first['id']}/results", params={"format": "lm-eval"}).json()
    assert doc["results"]["arc_easy"]["acc,none"] == pruned["value"]
    assert doc["prunecast"]["method"] == "slicegpt" and doc["prunecast"]["sparsity"] == 0.25
    assert doc["prunecast"]["dense"]["arc_easy"]["acc,none"] == dense["value"]

    second_body = prune_body(str(tiny_model_dir), 0.5, accuracy=accuracy, save_artifact=False)
    second = api.post("/v1/jobs", json=second_body).json()
    wait_done(api, second["id"], worker)
    second_rows = api.get(f"/v1/jobs/{second['id']}/results").json()["items"]
    assert {(row["method"], row["metric"]) for row in second_rows if row["dataset"] == "arc_easy"} == {
        ("slicegpt", "acc"),
        ("slicegpt", "acc_norm"),
    }
    reused = next(row for row in second_rows if row["metric"] == "acc")
    assert reused["protocol"]["dense_result_id"] == dense["id"] and reused["protocol"]["dense_reused"] is True
    dense_acc = api.get("/v1/results", params={"method": "dense", "metric": "acc"}).json()["items"]
    assert [row["id"] for row in dense_acc] == [dense["id"]]

    # Predictions read these results: acc of task arc_easy, chance from the stored protocol.
    answer = api.post(
        "/v1/predictions",
        json={
            "model": str(tiny_model_dir),
            "sparsities": [0.3],
            "metrics": [{"metric": "acc", "task": "arc_easy"}],
        },
    )
    assert answer.status_code == 200, answer.text
    predicted = answer.json()["metrics"][0]
    assert predicted["task"] == "arc_easy" and predicted["source"] == "store"
    assert predicted["baseline"]["result_id"] == dense["id"]
    assert predicted["protocol"]["chance"] == pytest.approx(dense["protocol"]["chance"])


def test_generative_tasks_run_in_evaluate_and_prune_jobs_export_lm_eval_keys_and_reuse_the_dense(
    api: TestClient, start_worker: Any, tiny_model_dir: Path
) -> None:
    worker = start_worker()
    accuracy = {"tasks": ["lambada_openai", "gsm8k"], "limit": 2, "max_new_tokens": 4, "batch_size": 2}
    evaluated = api.post("/v1/jobs", json=evaluate_body(str(tiny_model_dir), accuracy=accuracy)).json()
    wait_done(api, evaluated["id"], worker)
    rows = by_task_and_metric(api.get(f"/v1/jobs/{evaluated['id']}/results").json()["items"])
    assert set(rows) == {
        ("lambada_openai", "perplexity"),
        ("lambada_openai", "acc"),
        ("gsm8k", "exact_match,strict-match"),
        ("gsm8k", "exact_match,flexible-extract"),
    }
    gsm8k = rows[("gsm8k", "exact_match,strict-match")]
    assert gsm8k["split"] == "test" and gsm8k["n"] == 2 and gsm8k["value"] == 0.0  # a random model
    protocol = gsm8k["protocol"]
    assert protocol["num_fewshot"] == 5 and protocol["max_new_tokens"] == 4 and protocol["chance"] == 0.0
    assert protocol["stop_sequences"] == ["Question:", "</s>", "<|im_end|>"]
    assert protocol["truncated_prompts"] == 2  # 5-shot prompts exceed the tiny model's context
    assert len(protocol["examples"]) == 2 and sum(protocol["stopped_by"].values()) == 2
    assert rows[("lambada_openai", "perplexity")]["value"] > 1.0
    assert rows[("lambada_openai", "acc")]["protocol"]["num_fewshot"] == 0

    doc = api.get(f"/v1/jobs/{evaluated['id']}/results", params={"format": "lm-eval"}).json()
    assert set(doc["results"]["gsm8k"]) == {
        "alias",
        "exact_match,strict-match",
        "exact_match_stderr,strict-match",
        "exact_match,flexible-extract",
        "exact_match_stderr,flexible-extract",
    }
    assert (
        doc["results"]["lambada_openai"]["perplexity,none"] == rows[("lambada_openai", "perplexity")]["value"]
    )
    assert doc["higher_is_better"]["lambada_openai"] == {"perplexity": False, "acc": True}
    assert doc["configs"]["gsm8k"]["output_type"] == "generate_until"
    assert doc["configs"]["gsm8k"]["generation_kwargs"]["max_gen_toks"] == 4
    assert doc["n-shot"] == {"lambada_openai": 0, "gsm8k": 5}

    body = prune_body(str(tiny_model_dir), 0.5, method="wanda", accuracy=accuracy, save_artifact=False)
    pruned = api.post("/v1/jobs", json=body).json()
    wait_done(api, pruned["id"], worker)
    pruned_rows = api.get(f"/v1/jobs/{pruned['id']}/results").json()["items"]
    scored = {
        (row["dataset"], row["metric"]): row
        for row in pruned_rows
        if row["dataset"] in ("gsm8k", "lambada_openai")
    }
    assert set(scored) == set(rows) and all(row["method"] == "wanda" for row in scored.values())
    for key, row in scored.items():
        assert (
            row["protocol"]["dense_result_id"] == rows[key]["id"] and row["protocol"]["dense_reused"] is True
        )

    # The retention view pairs the pruned scores with these dense ones.
    model = quote(evaluated["model"], safe="")
    view = api.get(f"/v1/models/{model}/retention").json()
    (pruning,) = view["prunings"]
    assert pruning["method"] == "wanda" and pruning["sparsity"] == 0.5
    paired = {(s["dataset"], s["metric"]): s for s in pruning["scores"]}
    perplexity = paired[("lambada_openai", "perplexity")]
    assert perplexity["family"] == "perplexity"
    assert perplexity["dense_result_id"] == rows[("lambada_openai", "perplexity")]["id"]
    assert perplexity["retained"] == pytest.approx(perplexity["dense"] / perplexity["pruned"])
    assert ("wikitext2", "ppl") in paired
    floor = [note for note in pruning["skipped"] if note.startswith("gsm8k exact_match,flexible-extract")]
    assert floor and "floor" in floor[0]  # a random model scores 0 on GSM8K
    svg = api.get(f"/v1/models/{model}/retention", params={"format": "svg"})
    assert svg.status_code == 200 and svg.headers["content-type"].startswith("image/svg+xml")
    report = api.get(f"/v1/jobs/{pruned['id']}/report").text
    assert "when pruning works" in report
    nothing = api.get("/v1/models/nobody/retention").json()
    assert nothing["prunings"] == [] and "submit" in nothing["notes"][-1]
    assert_problem(api.get("/v1/models/nobody/retention", params={"format": "png"}), 404)


def test_missing_accuracy_baseline_names_an_evaluate_job_that_validates(
    api: TestClient, tiny_model_dir: Path
) -> None:
    body = {
        "model": str(tiny_model_dir.resolve()),
        "sparsities": [0.2],
        "metrics": [{"metric": "acc", "task": "piqa"}],
    }
    problem = assert_problem(api.post("/v1/predictions", json=body), 409)
    job = problem["job"]
    assert job["accuracy"]["tasks"] == ["piqa"]
    submitted = api.post("/v1/jobs", json=job)
    assert submitted.status_code == 202, submitted.text
