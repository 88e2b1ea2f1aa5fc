"""Sweeps fanned out across workers: one child prune job per sparsity, any worker takes any child,
the fit runs once all finished, with the numbers of a sweep run on one worker; canceling the sweep
cancels its children; the embedded deployment runs it all in one process; left to itself, a sweep
fans out only when more than one worker listens on its queue."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from fastapi.testclient import TestClient
from rq import Queue, Worker
from sqlalchemy import delete, select, update

from app.main import create_app
from core import lifecycle
from core.migrate import upgrade
from core.settings import Settings
from core.specs.jobs import SweepJobCreate
from core.store import Store
from core.tables import Fit, Job
from tests.app.test_prune_jobs import wait_done
from tests.app.test_sweep_jobs import items, sweep_body
from tests.conftest import wait_for
from workers.kinds.sweep_fanout import fans_out

SPARSITIES = [0.2, 0.3, 0.4, 0.5]


def _points(api: TestClient, job_ids: list[str]) -> dict[tuple[float, str], float]:
    """(sparsity, metric) -> value of the pruned results of these jobs."""
    return {
        (item["sparsity"], item["metric"]): item["value"]
        for job_id in job_ids
        for item in items(api, f"/v1/jobs/{job_id}/results")
        if item["method"] != "dense"
    }


def _children(api: TestClient, job_id: str) -> list[dict[str, Any]]:
    return items(api, "/v1/jobs", parent_id=job_id, limit=50)


def test_with_two_workers_a_sweep_spreads_its_sparsities_over_both_with_the_same_numbers(
    api: TestClient, start_worker: Any, tiny_model_dir: Path
) -> None:
    """`fan_out` left out: with two workers on the queue the sweep fans out by itself."""
    workers = [start_worker(), start_worker()]
    model = str(tiny_model_dir)
    # Children of a few seconds each, so that the second worker's fork and start are short beside them.
    protocol = {"perplexity": {"seqlen": 64, "max_windows": 8}, "method": "wanda"}
    in_turn = api.post("/v1/jobs", json=sweep_body(model, SPARSITIES, fan_out=False, **protocol)).json()
    wait_done(api, in_turn["id"], workers[0])
    assert _children(api, in_turn["id"]) == []
    fanned = api.post("/v1/jobs", json=sweep_body(model, SPARSITIES, **protocol)).json()
    done = wait_done(api, fanned["id"], workers[0])
    assert done["stage"] == "done" and done["progress"] == 1.0

    children = _children(api, fanned["id"])
    assert sorted(child["request"]["sparsity"] for child in children) == SPARSITIES
    assert all(child["kind"] == "prune" and child["status"] == "succeeded" for child in children)
    assert all(child["parent_id"] == fanned["id"] for child in children)
    # Some ran in the sweep's own process (its attempt's host:pid), some in the other worker's horses.
    ran_in = [child["worker"] == done["worker"] for child in children]
    assert any(ran_in) and not all(ran_in), ([child["worker"] for child in children], done["worker"])
    # The same points as the sweep measured in turn, tagged with the sweep, against its dense baseline.
    assert _points(api, [child["id"] for child in children]) == _points(api, [in_turn["id"]])
    assert _points(api, [fanned["id"]]) == _points(api, [in_turn["id"]])  # the sweep lists its children's
    for child in children:
        for item in items(api, f"/v1/jobs/{child['id']}/results"):
            assert item["protocol"]["sweep_job_id"] == fanned["id"]
    # The fit is the sweep's, over the same points.
    fits = items(api, "/v1/fits", job_id=fanned["id"])
    reference = items(api, "/v1/fits", job_id=in_turn["id"])
    assert [fit["params"] for fit in fits] == [fit["params"] for fit in reference] and fits


def test_canceling_a_fanned_out_sweep_cancels_its_children(
    api: TestClient, start_worker: Any, tiny_model_dir: Path
) -> None:
    worker = start_worker()
    sparsities = [round(0.05 * i, 2) for i in range(1, 11)]
    body = sweep_body(
        str(tiny_model_dir),
        sparsities,
        method="wanda",
        fan_out=True,
        perplexity={"seqlen": 64, "max_windows": 8},
    )
    job = api.post("/v1/jobs", json=body).json()
    wait_for(
        lambda: any(child["status"] == "succeeded" for child in _children(api, job["id"])),
        timeout=90,
        what="a first child to finish",
        interval=0.1,
    )
    assert api.delete(f"/v1/jobs/{job['id']}").status_code == 202
    done = api.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 60}).json()
    assert done["status"] == "canceled", (done, worker.output()[-3000:])
    wait_for(
        lambda: all(child["status"] in ("succeeded", "canceled") for child in _children(api, job["id"])),
        timeout=60,
        what="every child to end",
    )
    statuses = [child["status"] for child in _children(api, job["id"])]
    assert "canceled" in statuses and len(statuses) == len(sparsities)
    assert items(api, "/v1/fits", job_id=job["id"]) == []


def test_the_embedded_deployment_runs_a_fanned_out_sweep_in_its_one_process(
    make_settings: Any, tiny_model_dir: Path
) -> None:
    settings: Settings = make_settings()
    upgrade(settings.store_url)
    with TestClient(create_app(settings)) as api:
        body = sweep_body(str(tiny_model_dir), SPARSITIES, method="wanda", fan_out=True)
        job = api.post("/v1/jobs", json=body).json()
        done = api.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 180}).json()
        assert done["status"] == "succeeded", done
        children = _children(api, job["id"])
        assert len(children) == len(SPARSITIES) and all(child["status"] == "succeeded" for child in children)
        assert items(api, "/v1/fits", job_id=job["id"])
        # The sweep's report lists the points its children stored.
        page = api.get(f"/v1/jobs/{job['id']}/report").text
        points = [item for child in children for item in items(api, f"/v1/jobs/{child['id']}/results")]
        assert points and all(f'<td class="num">{item["id"]}</td>' in page for item in points)


def test_a_retried_fanned_out_sweep_keeps_the_children_that_finished(
    make_settings: Any, clean_store: Store, tiny_model_dir: Path
) -> None:
    from workers.tasks import execute_job

    settings = make_settings(database_url=clean_store.url)  # no Redis: the sweep runs its children
    body = sweep_body(str(tiny_model_dir), SPARSITIES, method="wanda", fan_out=True)
    with clean_store.session() as session:
        job_id = lifecycle.submit(
            session, kind="sweep", request=body, model_id=str(tiny_model_dir), request_hash="x"
        ).id
    execute_job(clean_store, settings, job_id)
    with clean_store.session() as session:
        first = {child.id: child.finished_at for child in lifecycle.children_of(session, job_id)}
        assert len(first) == len(SPARSITIES)
        # As if the sweep's worker died after its children finished, before it fitted: retried.
        session.execute(delete(Fit).where(Fit.job_id == job_id))
        session.execute(update(Job).where(Job.id == job_id).values(status="queued"))
    execute_job(clean_store, settings, job_id)
    with clean_store.session() as session:
        assert session.get(Job, job_id).status == "succeeded"
        again = {child.id: child.finished_at for child in lifecycle.children_of(session, job_id)}
        assert again == first  # no child created or run again
        assert session.scalars(select(Fit).where(Fit.job_id == job_id)).all()


def _sweep_context(settings: Settings, children: list[Job]) -> Any:
    """What `fans_out` reads of a running sweep: its settings and its child jobs."""
    return SimpleNamespace(settings=settings, job_id="sweep", read=lambda _read, _what: children)


def _spec(sparsities: list[float], **overrides: Any) -> SweepJobCreate:
    return SweepJobCreate.model_validate(sweep_body("tiny", sparsities, **overrides))


def test_a_sweep_fans_out_by_itself_only_with_more_than_one_worker_on_its_queue(
    rq_settings: Settings, clean_redis: Any, make_settings: Any
) -> None:
    queue = Queue(rq_settings.queue_name, connection=clean_redis)
    context = _sweep_context(rq_settings, [])
    registered = []
    for count in (0, 1, 2):
        fan_out, why = fans_out(context, _spec(SPARSITIES))
        assert fan_out is (count > 1) and f"{count} worker(s) listen" in why
        assert fans_out(context, _spec(SPARSITIES, fan_out=True))[0] is True  # asked for, whatever the count
        assert fans_out(context, _spec(SPARSITIES, fan_out=False))[0] is False
        worker = Worker([queue], connection=clean_redis, name=f"worker-{count}")
        worker.register_birth()
        registered.append(worker)
    assert fans_out(context, _spec([0.0, 0.3])) == (False, "one sparsity to prune")
    # Another queue's workers do not count.
    elsewhere = _sweep_context(make_settings(redis_url=rq_settings.redis_url), [])
    assert fans_out(elsewhere, _spec(SPARSITIES))[0] is False
    # A retried sweep that has children stays fanned out, with no worker at all.
    child = Job(id="child", kind="prune", status="running", request={"sparsity": 0.3})
    alone = _sweep_context(make_settings(redis_url=rq_settings.redis_url), [child])
    assert fans_out(alone, _spec(SPARSITIES)) == (True, "an earlier attempt of this sweep fanned out")
    # No queue: the embedded deployment, or one that does not answer, measures in turn.
    embedded = make_settings(redis_url=None)
    assert fans_out(_sweep_context(embedded, []), _spec(SPARSITIES))[0] is False
    silent = make_settings(redis_url="redis://127.0.0.1:1/0")
    fan_out, why = fans_out(_sweep_context(silent, []), _spec(SPARSITIES))
    assert fan_out is False and why.startswith("the queue did not answer")
    for worker in registered:
        worker.register_death()
