"""The first real job: the packaged SmolLM2-135M evaluated over HTTP by a real RQ worker."""

from __future__ import annotations

import math
from typing import Any

import pytest
from fastapi.testclient import TestClient

pytestmark = pytest.mark.slow

# Known value on these weights: first 20 WikiText-2 windows of 2048 tokens -> PPL 21.20
# (../shared/assets.md); two windows land near it (19.19 measured), not on it.
FIRST_WINDOWS_BALLPARK = (12.0, 40.0)


def test_evaluate_smollm2_over_http_stores_a_plausible_perplexity(api: TestClient, start_worker: Any) -> None:
    worker = start_worker()
    body = {"kind": "evaluate", "model": "smollm2-135m", "perplexity": {"max_windows": 2}}
    job = api.post("/v1/jobs", json=body).json()
    done = api.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 600}).json()
    assert done["status"] == "succeeded", (done, worker.output()[-3000:])
    results = api.get("/v1/results", params={"model": "smollm2-135m", "metric": "ppl"}).json()["items"]
    assert len(results) == 1
    result = results[0]
    print(f"SmolLM2-135M WikiText-2 PPL, seqlen 2048, 2 windows: {result['value']:.3f}")
    assert math.isfinite(result["value"])
    assert FIRST_WINDOWS_BALLPARK[0] < result["value"] < FIRST_WINDOWS_BALLPARK[1]
    assert result["protocol"]["seqlen"] == 2048 and result["protocol"]["windows"] == 2
    assert result["n"] == 2 * 2047
    assert result["model_revision"]  # the converted weights' key: which bytes were measured
