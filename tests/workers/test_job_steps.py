"""Steps the job kinds share: progress mapping within a stage, and finding a dense baseline to reuse."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch
from sqlalchemy import select
from transformers import AutoModelForCausalLM, AutoTokenizer

from core.settings import Settings
from core.specs.common import PerplexitySpec
from core.store import Store
from core.tables import Artifact, Base, Job, Result
from workers.context import JobContext, JobFailure
from workers.kinds.probe import tokenize
from workers.kinds.steps import find_dense_baseline, measure_perplexity, stage_progress, step_reporter
from workers.loading import LoadedModel

PROTOCOL = {"seqlen": 64, "max_windows": 2, "data_sha256": "a" * 64, "dtype": "float32"}


class RecordingContext:
    def __init__(self) -> None:
        self.reports: list[tuple[str, float, str | None]] = []

    def report(self, stage: str, progress: float, detail: str | None = None) -> None:
        self.reports.append((stage, progress, detail))


def test_stage_progress_maps_steps_onto_the_stage_range() -> None:
    assert stage_progress(0.3, 0.75, 0, 30) == pytest.approx(0.3)
    assert stage_progress(0.3, 0.75, 15, 30) == pytest.approx(0.525)
    assert stage_progress(0.3, 0.75, 30, 30) == pytest.approx(0.75)
    assert stage_progress(0.3, 0.75, 31, 30) == pytest.approx(0.75)
    assert stage_progress(0.3, 0.75, 0, 0) == pytest.approx(0.75)


def test_slicing_progress_reports_block_i_of_l() -> None:
    context = RecordingContext()
    progress = step_reporter(cast(JobContext, context), "slicing", 0.3, 0.75, "block")
    for done in range(3):
        progress(done, 2)
    assert context.reports == [
        ("slicing", pytest.approx(0.3), "block 0/2"),
        ("slicing", pytest.approx(0.525), "block 1/2"),
        ("slicing", pytest.approx(0.75), "block 2/2"),
    ]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store(f"sqlite:///{tmp_path / 'store.db'}")
    Base.metadata.create_all(store.engine)
    with store.session() as session:
        session.add(
            Job(id="job-1", kind="evaluate", request={}, model_id="m", request_hash="h", status="succeeded")
        )
    yield store
    store.dispose()


def add_result(store: Store, **fields: Any) -> int:
    values: dict[str, Any] = {
        "job_id": "job-1",
        "model_id": "m",
        "model_revision": None,
        "method": "dense",
        "metric": "ppl",
        "dataset": "wikitext2",
        "value": 10.0,
        "protocol": {**PROTOCOL, "elapsed_s": 1.0},
        **fields,
    }
    row = Result(**values)
    with store.session() as session:
        session.add(row)
    return row.id


def find(store: Store, **options: Any) -> Result | None:
    with store.session() as session:
        return find_dense_baseline(session, "m", None, "wikitext2", PROTOCOL, **options)


def test_dense_baseline_is_the_newest_with_the_same_model_data_and_protocol(store: Store) -> None:
    add_result(store)
    newest = add_result(store, value=11.0)
    add_result(store, method="slicegpt", sparsity=0.2)
    found = find(store)
    assert found is not None and found.id == newest


@pytest.mark.parametrize("status", ["queued", "running", "failed", "canceled"])
def test_a_baseline_of_an_unfinished_job_is_reused_only_by_that_job(store: Store, status: str) -> None:
    with store.session() as session:
        session.add(Job(id="job-2", kind="prune", request={}, model_id="m", request_hash="h2", status=status))
    older = add_result(store)
    unfinished = add_result(store, job_id="job-2", value=12.0)
    found = find(store)
    assert found is not None and found.id == older  # its rows may still vanish: never shared
    own = find(store, own_job_id="job-2")
    assert own is not None and own.id == unfinished  # a resumed attempt finds its own


@pytest.mark.parametrize(
    "different",
    [
        {"protocol": {**PROTOCOL, "max_windows": None}},
        {"protocol": {**PROTOCOL, "seqlen": 128}},
        {"protocol": {**PROTOCOL, "dtype": "bfloat16"}},
        {"protocol": {**PROTOCOL, "data_sha256": "b" * 64}},
        {"model_revision": "abc"},
        {"model_id": "other"},
        {"metric": "acc"},
        {"source": "predicted"},
    ],
)
def test_a_baseline_measured_differently_is_not_reused(store: Store, different: dict[str, Any]) -> None:
    add_result(store, **different)
    assert find(store) is None


def running_context(store: Store, settings: Settings) -> JobContext:
    with store.session() as session:
        session.add(Job(id="job-2", kind="sweep", request={}, model_id="m", request_hash="h2"))
    context = JobContext.claim(store, settings, "job-2")
    assert context is not None
    return context


def test_a_folder_written_again_replaces_its_artifact_row(
    store: Store, worker_settings: Callable[..., Settings]
) -> None:
    context = running_context(store, worker_settings())
    context.add_artifacts([Artifact(kind="sliced-model", path="/a/s0.2", bytes=1, sha256="1" * 64)])
    context.add_artifacts([Artifact(kind="sliced-model", path="/a/s0.3", bytes=1, sha256="2" * 64)])
    context.add_artifacts([Artifact(kind="sliced-model", path="/a/s0.2", bytes=2, sha256="3" * 64)])
    with store.session() as session:
        rows = session.scalars(select(Artifact).where(Artifact.job_id == "job-2").order_by(Artifact.id)).all()
        assert [(row.path, row.bytes) for row in rows] == [("/a/s0.3", 1), ("/a/s0.2", 2)]


def test_a_non_finite_perplexity_fails_the_job_with_the_reason(
    store: Store, worker_settings: Callable[..., Settings], tiny_model_dir: Path
) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        model.lm_head.weight.fill_(float("nan"))
    context = running_context(store, worker_settings())
    tokens = torch.arange(1, 130) % 200
    with pytest.raises(
        JobFailure, match=r"perplexity is not finite \(nan.*measure in float32, or prune less"
    ):
        measure_perplexity(
            context, model, tokens, PerplexitySpec(seqlen=64), 64, stage="perplexity", start=0.0, end=1.0
        )


def test_a_probe_whose_generation_fills_the_context_is_refused_with_the_reason(tiny_model_dir: Path) -> None:
    loaded = SimpleNamespace(
        tokenizer=AutoTokenizer.from_pretrained(tiny_model_dir),
        model=SimpleNamespace(config=SimpleNamespace(max_position_embeddings=64)),
        device=torch.device("cpu"),
    )
    assert tokenize(cast(LoadedModel, loaded), "x" * 100, room=16).numel() == 48  # cut to leave room
    with pytest.raises(JobFailure, match=r"max_new_tokens \(64\) leaves no room .* context of 64 tokens"):
        tokenize(cast(LoadedModel, loaded), "hello", room=64)
