"""Published curves are stored as `source: published`, scored by the backtests as their own curves,
and never mixed into a model's measured points."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from core.published import PUBLISHED_CURVES, import_published
from core.store import Store
from tests.app.store_points import add_series, ppl_protocol


def test_import_is_idempotent_and_rows_are_marked_published(api: TestClient, clean_store: Store) -> None:
    with clean_store.session() as session:
        assert len(import_published(session)) == len(PUBLISHED_CURVES)
    with clean_store.session() as session:
        assert import_published(session) == []  # already there
    rows = api.get("/v1/results", params={"source": "published", "model": "facebook/opt-125m"}).json()[
        "items"
    ]
    assert len(rows) == 5 and {row["source"] for row in rows} == {"published"}
    assert api.get("/v1/results", params={"source": "measured"}).json()["items"] == []
    assert rows[0]["protocol"]["reference"].startswith("Ashkboos et al., SliceGPT")


def test_backtests_score_the_strict_law_on_published_curves_and_predictions_ignore_them(
    api: TestClient, clean_store: Store
) -> None:
    with clean_store.session() as session:
        import_published(session)
    backtests = api.get("/v1/backtests", params={"points": True}).json()
    labels = [curve["label"] for curve in backtests["curves"]]
    assert all(label.startswith("published: ") for label in labels) and len(labels) == 2
    strict = next(item for item in backtests["items"] if item["predictor"] == "strict law" and item["n"] == 8)
    opt_25 = next(p for p in strict["points"] if "opt-125m" in p["curve"] and p["sparsity"] == 0.25)
    assert opt_25["predicted"] == pytest.approx(27.64 ** (1 / 0.75)) and opt_25["ape"] == pytest.approx(
        1.19, abs=0.01
    )
    # No measured dense baseline of OPT-125M: the published one is not used in its place.
    answer = api.post("/v1/predictions", json={"model": "facebook/opt-125m", "sparsities": [0.25]})
    assert answer.status_code == 409, answer.text
    # A measured curve of the same model stays its own series.
    add_series(clean_store, "facebook/opt-125m", 30.0, [(0.25, 40.0)], protocol=ppl_protocol())
    [metric] = api.post("/v1/predictions", json={"model": "facebook/opt-125m", "sparsities": [0.25]}).json()[
        "metrics"
    ]
    assert metric["baseline"]["value"] == 30.0 and [p["value"] for p in metric["fitted_on"]] == [40.0]


def test_a_published_curve_is_drawn_as_its_own_source(api: TestClient, clean_store: Store) -> None:
    with clean_store.session() as session:
        import_published(session)
    path = "/v1/models/facebook/opt-125m/curves"
    assert api.get(path).status_code == 404  # nothing measured: published points do not stand in
    curve = api.get(path, params={"source": "published"}).json()
    assert curve["source"] == "published" and curve["measured"][0]["value"] == pytest.approx(27.64)
    assert [p["sparsity"] for p in curve["measured"]] == [0.0, 0.1, 0.2, 0.25, 0.3]
    assert curve["calibrated"] is not None and curve["profile_predictor"] is None
    drawn = api.get(path, params={"source": "published", "format": "svg"})
    assert drawn.status_code == 200 and "published" in drawn.text
    add_series(clean_store, "facebook/opt-125m", 30.0, [(0.25, 40.0)], protocol=ppl_protocol())
    measured = api.get(path).json()
    assert measured["source"] == "measured" and [p["value"] for p in measured["measured"]] == [30.0, 40.0]


def test_backtests_are_computed_once_per_state_of_the_store(
    api: TestClient, clean_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.services.prediction import scored_curves as profiles

    calls: list[str] = []
    read = profiles.store_curves

    def counted(session: Any, method: str) -> Any:
        calls.append(method)
        return read(session, method)

    monkeypatch.setattr(profiles, "store_curves", counted)
    profiles._scored.clear()  # an empty store an earlier test saw is this state too
    assert api.get("/v1/backtests").json()["curves"] == api.get("/v1/backtests").json()["curves"] == []
    assert len(calls) == 1
    with clean_store.session() as session:
        import_published(session)  # new fits: the cached answer is stale
    assert len(api.get("/v1/backtests").json()["curves"]) == 2 and len(calls) == 2
    api.get("/v1/backtests", params={"level": 0.9})
    assert calls == ["slicegpt"] * 3
    api.get("/v1/backtests", params={"method": "wanda"})  # and its sibling methods' curves, once
    api.get("/v1/backtests", params={"method": "wanda"})
    assert calls[3:] == ["wanda", "sparsegpt", "magnitude", "magnitude-row"]


def test_the_cli_imports_published_curves(tmp_path: Path) -> None:
    env = {"PRUNECAST_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    for expected in ("2 curve(s) imported", "every published curve is in the store"):
        subprocess.run(
            [sys.executable, "-m", "app.cli", "migrate"],
            env=env,
            check=True,
            capture_output=True,
            timeout=120,
        )
        done = subprocess.run(
            [sys.executable, "-m", "app.cli", "import-published"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert expected in done.stdout
