"""Jobs travel the whole way through real workers: RQ worker processes on Postgres + Redis,
and the embedded SQLite + thread deployment. Failures of the transport or of a worker never
lose a job or leave it `running`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select, update

from app.main import create_app
from core.migrate import upgrade
from core.settings import Settings
from core.store import Store
from core.tables import Job
from tests.app.test_jobs_api import evaluate_body
from tests.conftest import wait_for

# Long enough (800 tiny windows, ~5-30 s) to be caught mid-run, short enough to rerun.
LONG_RUN = {"max_windows": 800, "seqlen": 16}


def job_state(api: TestClient, job_id: str) -> dict[str, Any]:
    body: dict[str, Any] = api.get(f"/v1/jobs/{job_id}").json()
    return body


def wait_terminal(api: TestClient, job_id: str, timeout: float = 120) -> dict[str, Any]:
    return wait_for(
        lambda: (job := job_state(api, job_id))["status"] in ("succeeded", "failed", "canceled") and job,
        timeout,
        f"job {job_id} to finish",
    )


def test_evaluate_job_runs_through_a_real_rq_worker(
    api: TestClient, start_worker: Any, tiny_model_dir: Path
) -> None:
    worker = start_worker()
    job = api.post("/v1/jobs", json=evaluate_body(str(tiny_model_dir), max_windows=3)).json()
    done = api.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 120}).json()
    assert done["status"] == "succeeded", (done, worker.output()[-3000:])
    assert done["attempts"] == 1 and done["progress"] == 1.0 and done["stage"] == "done"
    assert done["environment"]["torch"] and done["environment"]["device"] == "cpu"
    results = api.get("/v1/results", params={"model": done["model"], "metric": "ppl"}).json()["items"]
    assert len(results) == 1
    result = results[0]
    assert result["job_id"] == job["id"] and result["method"] == "dense" and result["dataset"] == "wikitext2"
    assert math.isfinite(result["value"]) and result["value"] > 1
    assert result["protocol"]["windows"] == 3 and result["protocol"]["seqlen"] == 64
    assert len(result["protocol"]["data_sha256"]) == 64
    assert api.get(f"/v1/jobs/{job['id']}/results").json()["items"] == results
    assert '"job_id": "' + job["id"] in worker.output()  # structured logs carry the job id


def test_a_job_that_cannot_run_fails_with_a_readable_reason(
    api: TestClient, start_worker: Any, model_root: Path
) -> None:
    folder = model_root / "broken-weights"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text('{"model_type": "llama", "architectures": ["LlamaForCausalLM"]}')
    start_worker()
    job = api.post("/v1/jobs", json=evaluate_body(str(folder))).json()
    done = api.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 120}).json()
    assert done["status"] == "failed"
    assert str(folder.resolve()) in done["error"] or "broken-weights" in done["error"]


def test_cancel_running_job_stops_at_next_safe_point(
    api: TestClient, start_worker: Any, tiny_model_dir: Path
) -> None:
    start_worker()
    job = api.post("/v1/jobs", json=evaluate_body(str(tiny_model_dir), **LONG_RUN)).json()
    wait_for(lambda: job_state(api, job["id"])["stage"] == "perplexity", 120, "the job to be scoring")
    response = api.delete(f"/v1/jobs/{job['id']}")
    assert response.status_code == 202 and response.json()["cancel_requested"]
    done = wait_terminal(api, job["id"], 60)
    assert done["status"] == "canceled"
    assert api.get("/v1/results", params={"job_id": job["id"]}).json()["items"] == []


def test_jobs_queued_when_redis_is_flushed_still_run(
    api: TestClient, start_worker: Any, clean_redis: Any, tiny_model_dir: Path
) -> None:
    ids = [
        api.post("/v1/jobs", json=evaluate_body(str(tiny_model_dir), max_windows=n)).json()["id"]
        for n in (1, 2)
    ]
    assert api.get("/metrics").text.count("prunecast_queue_depth 2.0") == 1
    clean_redis.flushdb()  # Redis keeps nothing on disk: a restart looks exactly like this
    start_worker()
    for job_id in ids:
        done = wait_terminal(api, job_id)
        assert done["status"] == "succeeded", done


def test_dead_job_without_attempts_left_fails_with_reason(
    api: TestClient, rq_settings: Settings, tiny_model_dir: Path
) -> None:
    job = api.post("/v1/jobs", json=evaluate_body(str(tiny_model_dir))).json()
    store = Store(rq_settings.store_url)
    with store.session() as session:  # as if a worker claimed it for its last attempt, then died
        session.execute(
            update(Job).where(Job.id == job["id"]).values(status="running", attempts=rq_settings.max_attempts)
        )
    store.dispose()
    done = wait_terminal(api, job["id"], 30)
    assert done["status"] == "failed"
    assert "worker stopped responding" in done["error"] and "giving up" in done["error"]


def test_embedded_mode_runs_jobs_in_process_on_sqlite(make_settings: Any, tiny_model_dir: Path) -> None:
    settings = make_settings()  # no DATABASE_URL, no REDIS_URL
    assert settings.embedded and settings.store_url.startswith("sqlite:///")
    upgrade(settings.store_url)
    with TestClient(create_app(settings)) as api:
        job = api.post("/v1/jobs", json=evaluate_body(str(tiny_model_dir), max_windows=2)).json()
        done = api.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 120}).json()
        assert done["status"] == "succeeded", done
        results = api.get("/v1/results", params={"job_id": job["id"]}).json()["items"]
        assert [r["metric"] for r in results] == ["ppl"] and math.isfinite(results[0]["value"])
        long_job = api.post("/v1/jobs", json=evaluate_body(str(tiny_model_dir), **LONG_RUN)).json()
        wait_for(lambda: job_state(api, long_job["id"])["stage"] == "perplexity", 60, "the long job to run")
        assert api.delete(f"/v1/jobs/{long_job['id']}").status_code == 202
        assert wait_terminal(api, long_job["id"], 60)["status"] == "canceled"


def test_embedded_restart_picks_up_jobs_left_queued(make_settings: Any, tiny_model_dir: Path) -> None:
    settings = make_settings(embedded_worker=False)
    upgrade(settings.store_url)
    with TestClient(create_app(settings)) as api:  # accepts jobs, runs none (worker disabled)
        job = api.post("/v1/jobs", json=evaluate_body(str(tiny_model_dir), max_windows=1)).json()
    restarted = settings.model_copy(update={"embedded_worker": True})
    with TestClient(create_app(restarted)) as api:
        assert wait_terminal(api, job["id"], 120)["status"] == "succeeded"


def test_a_retried_job_replaces_what_its_dead_attempt_stored(
    make_settings: Any, clean_store: Store, tiny_model_dir: Path
) -> None:
    from core.tables import Result
    from workers.tasks import execute_job

    settings = make_settings(database_url=clean_store.url)
    with clean_store.session() as session:  # attempt 1 stored a result, then its worker died
        job = Job(
            kind="evaluate",
            request=evaluate_body(str(tiny_model_dir), max_windows=1),
            model_id=str(tiny_model_dir),
            request_hash="x",
            attempts=1,
        )
        session.add(job)
        session.flush()
        session.add(
            Result(
                job_id=job.id,
                model_id=job.model_id,
                method="dense",
                metric="ppl",
                dataset="wikitext2",
                value=123.0,
            )
        )
        job_id = job.id
    execute_job(clean_store, settings, job_id)
    with clean_store.session() as session:
        stored = session.scalars(select(Result).where(Result.job_id == job_id)).all()
        assert session.get(Job, job_id).status == "succeeded"
    assert len(stored) == 1 and stored[0].value != 123.0
