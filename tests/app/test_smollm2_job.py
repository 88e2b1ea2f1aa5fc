"""The first real job: the packaged SmolLM2-135M evaluated over HTTP by a real RQ worker."""

from __future__ import annotations

import math
import statistics
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


def test_probe_of_smollm2_with_attention_drop_tracks_kl_with_its_taylor_estimate(
    api: TestClient, start_worker: Any
) -> None:
    """The claim the per-layer probe rests on (docs/science.md §3), on real weights: across layers 2..L-1
    the Taylor estimate Var_p(dz)/2T² follows the exact KL of each dropped attention branch."""
    worker = start_worker()
    body = {
        "kind": "probe",
        "model": "smollm2-135m",
        "method": "attention-drop",
        "sparsity": 8 / 30,
        "calibration": {"num_sequences": 8, "seqlen": 256},
        # the 12 built-in prompts: two prompts were too few tokens for a stable correlation once the
        # attention is measured at its own sublayer output (0.76 on 2 prompts, 0.96 on these 12)
        "prompts": None,
        "sublayers": ["attention"],
        "generation": None,
    }
    job = api.post("/v1/jobs", json=body).json()
    done = api.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 900}).json()
    assert done["status"] == "succeeded", (done, worker.output()[-3000:])
    page = api.get(
        f"/v1/jobs/{job['id']}/probes",
        params={"probe": "counterfactual", "space": "probs", "metric": "kl", "limit": 100},
    ).json()
    kl = {point["layer"]: point for point in page["items"]}
    assert len(kl) == 8  # one point per dropped attention branch, none where attention is intact
    middle = [kl[layer] for layer in sorted(kl) if 1 <= layer <= 28]  # layers 2..L-1, counted from 1
    pearson = statistics.correlation([p["estimate"] for p in middle], [p["value"] for p in middle])
    print(f"SmolLM2 attention-drop: Pearson(KL estimate, KL) over layers 2..L-1 = {pearson:.3f}")
    assert pearson > 0.8
    [summary] = [s for s in page["summary"] if s["metric"] == "kl" and s["space"] == "probs"]
    assert summary["correlation"] == pytest.approx(
        statistics.correlation([p["estimate"] for p in kl.values()], [p["value"] for p in kl.values()])
    )
    svg = api.get(f"/v1/jobs/{job['id']}/probes/plot.svg", params={"view": "layers", "sublayer": "attention"})
    assert svg.status_code == 200
