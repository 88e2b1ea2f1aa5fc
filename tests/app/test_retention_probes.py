"""The retention view keeps probe readings of different conventions apart."""

from __future__ import annotations

from fastapi.testclient import TestClient

from core.store import Store
from core.tables import Result
from tests.app.store_points import add_job, add_series
from tests.app.store_probes import add_probe_points

MODEL = "retention-model"


def _probe(store: Store, final_kl: float, **request: object) -> str:
    job_id = add_job(store, MODEL, kind="probe", method="wanda", sparsity=0.5, **request)
    point = {"probe": "model", "layer": None, "sublayer": None, "space": "probs", "step": None}
    add_probe_points(store, job_id, [{**point, "metric": "kl", "value": final_kl, "estimate": None}])
    return job_id


def test_retention_shows_the_newest_probe_of_each_convention_without_pooling(
    api: TestClient, clean_store: Store
) -> None:
    dense_id, pruned_id = add_series(clean_store, MODEL, 20.0, [(0.5, 30.0)], method="wanda")
    with clean_store.session() as session:
        pruned = session.get(Result, pruned_id)
        assert pruned is not None
        pruned.protocol = {**pruned.protocol, "dense_result_id": dense_id}
    _probe(clean_store, 0.9)  # an older default-convention probe: superseded
    newest = _probe(clean_store, 0.4, convention="prunecast", temperature=1.0)
    released = _probe(clean_store, 2.5, convention="released-code", temperature=0.5)

    [row] = api.get(f"/v1/models/{MODEL}/retention").json()["prunings"]
    assert row["probe"]["job_id"] == newest and row["probe"]["final_kl"] == 0.4
    by_convention = {reading["convention"]: reading for reading in row["probes"]}
    assert set(by_convention) == {"prunecast", "released-code"}
    assert by_convention["released-code"]["job_id"] == released
    assert (by_convention["released-code"]["final_kl"], by_convention["released-code"]["temperature"]) == (
        2.5,
        0.5,
    )
