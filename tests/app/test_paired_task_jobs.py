"""Task scores to a precision: docs in a seeded order, paired with the dense model's right-or-wrong
record on every doc; the same docs a simulation and a prune of the same seed score, and an estimate
recomputable from the stored records."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from core.prediction.paired_docs import FIRST_DOCS, doc_order, estimate_score
from tests.app.test_jobs_api import assert_problem
from tests.app.test_prune_jobs import prune_body, wait_done
from tests.app.test_simulate_jobs import PERPLEXITY, simulate_body

DOCS = 48
METRICS = ("acc", "acc_norm")


def _accuracy(precision: float | None) -> dict[str, Any]:
    return {"tasks": ["arc_easy"], "limit": DOCS, "batch_size": 16, "precision": precision}


def _task_rows(api: TestClient, worker: Any, body: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """(method or source, metric) -> the job's arc_easy row."""
    job = api.post("/v1/jobs", json=body).json()
    wait_done(api, job["id"], worker)
    rows = api.get("/v1/results", params={"job_id": job["id"], "limit": 50}).json()["items"]
    return {
        ("dense" if r["method"] == "dense" else r["source"], r["metric"]): r
        for r in rows
        if r["dataset"] == "arc_easy"
    }


def test_a_paired_score_rests_on_the_seeded_docs_and_equals_its_recomputed_estimate(
    api: TestClient, start_worker: Any, tiny_model_dir: Path
) -> None:
    """A wide precision stops at the first look: 32 of the 48 docs. A magnitude simulation and a prune
    of the same seed score the same docs alike (the simulated model is the pruned model); each value
    is the paired estimate of its stored records, and its band holds the every-doc score."""
    worker = start_worker()
    model = str(tiny_model_dir)
    prune = prune_body(model, 0.5, method="magnitude", accuracy=_accuracy(0.45), perplexity=PERPLEXITY)
    pruned = _task_rows(api, worker, prune)
    dense_record = {m: pruned[("dense", m)]["protocol"]["doc_scores"] for m in METRICS}
    assert all(len(rights) == DOCS and set(rights) <= {0, 1} for rights in dense_record.values())
    sampled = {m: pruned[("measured", m)] for m in METRICS}
    for metric, row in sampled.items():
        paired = row["protocol"]["paired_docs"][metric]
        assert (paired["docs"], paired["of_docs"], row["n"]) == (FIRST_DOCS, DOCS, FIRST_DOCS)
        order = doc_order(DOCS, paired["order_seed"])[:FIRST_DOCS]
        again = estimate_score(dict(zip(order, paired["doc_scores"], strict=True)), dense_record[metric])
        assert math.isclose(row["value"], again.value, rel_tol=1e-12)
        lm_eval = again.value * (1 - again.value) / (DOCS - 1)
        assert math.isclose(row["stderr"], math.sqrt(lm_eval + again.stderr**2), rel_tol=1e-9)

    simulate = simulate_body(
        model,
        method="magnitude",
        sparsities=[0.5],
        anchors=[],
        accuracy=_accuracy(0.45),
        perplexity=PERPLEXITY,
    )
    simulated = _task_rows(api, worker, simulate)
    for metric in METRICS:
        twin = simulated[("simulated", metric)]
        assert twin["value"] == sampled[metric]["value"]
        assert twin["protocol"]["paired_docs"] == sampled[metric]["protocol"]["paired_docs"]
    question = {
        "model": model,
        "method": "magnitude",
        "sparsities": [0.5],
        "metrics": [{"metric": "acc", "task": "arc_easy"}],
        "protocol": {"seqlen": 64, "max_windows": 3},
    }
    answer = api.post("/v1/predictions", json=question).json()["metrics"][0]["predictions"][0]
    assert answer["rung"] in {"measured", "simulated"}
    said = [a for a in [answer, *answer.get("alternatives", [])] if a["rung"] == "simulated"]
    assert said and f"{FIRST_DOCS} of {DOCS} docs paired" in str(said[0])

    every_doc = prune_body(model, 0.5, method="magnitude", accuracy=_accuracy(None), perplexity=PERPLEXITY)
    truth = _task_rows(api, worker, every_doc)
    for metric in METRICS:
        full = truth[("measured", metric)]
        assert "paired_docs" not in full["protocol"] and full["n"] == DOCS
        paired = sampled[metric]["protocol"]["paired_docs"][metric]
        assert paired["low"] <= full["value"] <= paired["high"]


def test_a_precision_out_of_reach_scores_every_doc_and_gives_the_every_doc_score(
    api: TestClient, start_worker: Any, tiny_model_dir: Path
) -> None:
    worker = start_worker()
    model = str(tiny_model_dir)
    tight = _task_rows(
        api,
        worker,
        prune_body(model, 0.4, method="magnitude", accuracy=_accuracy(1e-4), perplexity=PERPLEXITY),
    )
    every = _task_rows(
        api,
        worker,
        prune_body(model, 0.4, method="magnitude", accuracy=_accuracy(None), perplexity=PERPLEXITY),
    )
    for metric in METRICS:
        row, full = tight[("measured", metric)], every[("measured", metric)]
        paired = row["protocol"]["paired_docs"][metric]
        assert paired["docs"] == paired["of_docs"] == DOCS and paired["low"] == paired["high"]
        assert row["value"] == full["value"]
        assert math.isclose(row["stderr"], full["stderr"], rel_tol=1e-9)


@pytest.mark.parametrize("precision", [0, 1, -0.1, "tight"])
def test_an_accuracy_precision_outside_zero_one_is_a_422_naming_the_field(
    api: TestClient, tiny_model_dir: Path, precision: Any
) -> None:
    accuracy = {"tasks": ["arc_easy"], "precision": precision}
    body = prune_body(str(tiny_model_dir), method="magnitude", accuracy=accuracy)
    problem = assert_problem(api.post("/v1/jobs", json=body), 422)
    assert "precision" in str(problem)
