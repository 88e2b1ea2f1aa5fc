"""Jobs on a device too small for the model: with the device budget capped below the model's size
the worker streams the blocks through the device, records the plan, and stores the numbers the
in-memory run stores."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from app.main import create_app
from core.migrate import upgrade

EVALUATE = {"kind": "evaluate", "perplexity": {"seqlen": 64, "max_windows": 2}}
PRUNE = {
    "kind": "prune",
    "method": "wanda",
    "sparsity": 0.5,
    "calibration": {"num_sequences": 4, "seqlen": 32, "batch_size": 2},
    "perplexity": {"seqlen": 64, "max_windows": 2},
}
TIMINGS = ("/probe_cost_multiple",)  # wall-time ratios, which no two runs share
PROBE = {
    "kind": "probe",
    "method": "wanda",
    "sparsity": 0.5,
    "prompts": [{"text": "The river runs past the old mill, under the bridge and into the sea."}],
    "calibration": {"num_sequences": 4, "seqlen": 32, "batch_size": 2},
}
PROFILE = {
    "kind": "profile",
    "calibration": {"num_sequences": 4, "seqlen": 32, "batch_size": 2},
    "sparsities": [0.25, 0.5],
}


def _run(settings: Any, model: str) -> tuple[dict[str, dict[str, Any]], list[Any], list[Any]]:
    """Run every job kind but sweeps in an embedded deployment: the results by job kind, method and
    metric; the probe job's points; the profile."""
    upgrade(settings.store_url)
    found: dict[str, dict[str, Any]] = {}
    with TestClient(create_app(settings)) as api:
        ids = {}
        for body in (EVALUATE, PRUNE, PROBE, PROFILE):
            job = api.post("/v1/jobs", json={**body, "model": model}).json()
            done = api.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 180}).json()
            assert done["status"] == "succeeded", done
            ids[body["kind"]] = job["id"]
            for item in api.get(f"/v1/jobs/{job['id']}/results").json()["items"]:
                found[f"{body['kind']}:{item['method']}/{item['metric']}"] = item
        points = api.get(f"/v1/jobs/{ids['probe']}/probes", params={"limit": 1000}).json()["items"]
        profile = api.get(f"/v1/models/{model}/profile").json()["signals"]
    probe_values = sorted(
        (point["probe"], point["space"], point["metric"], str(point["layer"]), point["value"])
        for point in points
    )
    return found, probe_values, profile


def test_a_capped_device_budget_offloads_and_gives_the_in_memory_numbers(
    make_settings: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    weights = sum(path.stat().st_size for path in tiny_model_dir.glob("*.safetensors"))
    whole, whole_probes, whole_profile = _run(make_settings(home=tmp_path / "whole"), str(tiny_model_dir))
    capped, capped_probes, capped_profile = _run(
        make_settings(home=tmp_path / "capped", device_memory_bytes=weights), str(tiny_model_dir)
    )
    assert whole_probes and capped_probes == whole_probes
    assert whole_profile and capped_profile == whole_profile
    # the prune job reuses the evaluate job's dense perplexity
    assert (
        set(whole)
        == set(capped)
        >= {"evaluate:dense/ppl", "prune:wanda/ppl", "probe:wanda/probe_cost_multiple"}
    )
    for key, item in whole.items():
        if not key.endswith(TIMINGS):
            assert capped[key]["value"] == item["value"], key
        assert item["protocol"]["memory_plan"]["offloaded"] is False
        plan = capped[key]["protocol"]["memory_plan"]
        assert plan["offloaded"] is True and plan["device_budget_bytes"] == weights
        assert (
            plan["model_bytes"] > 0.8 * weights
            and plan["resident_bytes"] + plan["largest_block_bytes"] <= weights
        )
