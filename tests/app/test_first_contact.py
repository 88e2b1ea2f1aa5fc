"""The first contact: a model nobody has measured gets, in two requests, an answer from the best rung
the service can build for it, with the band and verdict that rung has earned."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from fastapi.testclient import TestClient

from core.store import Store
from tests.app.test_prune_jobs import wait_done
from tests.app.test_sweep_jobs import sweep_body
from workers.simulation.streams_dtype import computes_bfloat16_natively

PROTOCOL = {"seqlen": 64, "max_windows": 2}
CALIBRATION = {"num_sequences": 4, "seqlen": 32}


def ask(api: TestClient, model: str, **extra: Any) -> Any:
    body = {
        "model": model,
        "method": "slicegpt",
        "sparsities": [0.25, 0.4, 0.5],
        "protocol": PROTOCOL,
        "calibration": CALIBRATION,
        **extra,
    }
    return api.post("/v1/predictions", json=body)


def test_measure_missing_queues_one_simulation_then_the_answer_comes_from_it(
    api: TestClient, start_worker: Any, tiny_model_dir: Path, clean_store: Store
) -> None:
    worker = start_worker()
    model = str(tiny_model_dir)
    first = ask(api, model, measure_missing=True)
    assert first.status_code == 202, first.text
    job = first.json()["job"]
    assert job["kind"] == "simulate" and job["request"]["sparsities"] == [0.25, 0.4, 0.5]
    request = job["request"]
    assert request["perplexity"]["max_windows"] == 2 and request["calibration"]["num_sequences"] == 4
    assert request["perplexity"]["precision"] == 0.02  # the cheap answer, unless the caller says
    assert wait_done(api, job["id"], worker)["status"] == "succeeded"

    again = ask(api, model)
    assert again.status_code == 200, again.text
    [ppl] = again.json()["metrics"]
    assert ppl["missing"] == [] and ppl["queued"] == []
    dense = ppl["baseline"]["value"]
    for predicted in ppl["predictions"]:
        assert predicted["rung"] == "simulated", predicted
        low, high = predicted["band"]
        assert min(dense, predicted["value"]) <= low <= predicted["value"] < high
        verdict = predicted["verdict"]  # no measured curve: the bench's record, named as such
        assert verdict["level"] in {"reliable", "rough"} and "bench record" in verdict["advice"]
        rungs = {a["rung"]: a for a in predicted["alternatives"]}
        assert "of 2 windows" in rungs["simulated"]["source"]  # which windows the value rests on
        streamed = "streamed in bfloat16" in rungs["simulated"]["source"]  # and how its bases were had
        assert streamed == computes_bfloat16_natively(torch.device("cpu"))
        assert rungs["law"]["value"] is None and "no pruned point" in rungs["law"]["why_not"]
        assert rungs["measured"]["why_not"] and rungs["strict"]["value"] is not None

    # A measured point joins: it answers its own sparsity, and scales the simulation elsewhere.
    sweep = sweep_body(model, [0.25], calibration={**CALIBRATION, "batch_size": 2})
    assert wait_done(api, api.post("/v1/jobs", json=sweep).json()["id"], worker)["status"] == "succeeded"
    [ppl] = ask(api, model).json()["metrics"]
    at_quarter, at_forty, _ = ppl["predictions"]
    assert at_quarter["rung"] == "measured" and at_quarter["verdict"]["level"] == "measured"
    assert at_forty["rung"] == "simulated" and "through the measured points at 0.25" in at_forty["predictor"]
    assert "anchored_on_measured" in at_forty["flags"]
    # The simulated rung's record: the simulation at face value against the measured point.
    items = api.get("/v1/backtests", params={"points": True}).json()["items"]
    [face] = [i for i in items if i["predictor"] == "simulated at face value"]
    assert face["rung"] == "simulated" and face["n"] == 1 and face["record"]["models"] == 1
    [point] = face["points"]
    assert point["sparsity"] == 0.25 and point["measured"] == at_quarter["value"]
