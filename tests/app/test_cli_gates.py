"""`prunecast predict` and `submit --wait` gates against a live server on Postgres: the exit codes CI
scripts rely on (0 ok, 1 gate failed, 3 usage or refused request)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from app.cli import build_parser, main
from app.cli_client import EXIT_GATE_FAILED, EXIT_OK, EXIT_USAGE
from app.cli_predict import _predict_body
from core.settings import Settings
from core.store import Store
from tests.app.live_server import live_server
from tests.app.store_points import OPT_125M_DENSE, add_series

OPT = "facebook/opt-125m"


@pytest.fixture
def server(make_settings: Callable[..., Settings], clean_store: Store) -> Iterator[str]:
    """The API on the test run's Postgres store, no worker (jobs stay queued)."""
    add_series(clean_store, OPT, OPT_125M_DENSE, [(0.1, 29.33), (0.2, 34.53), (0.3, 44.61)])
    with live_server(make_settings(database_url=clean_store.url, embedded_worker=False)) as url:
        yield url


def predict(capsys: pytest.CaptureFixture[str], server: str, *argv: str) -> tuple[int, str, str]:
    code = main(["predict", "--model", OPT, "--server", server, *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_predict_gate_exits_1_when_predicted_ppl_exceeds_the_threshold_and_0_otherwise(
    server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = predict(capsys, server, "--sparsity", "0.25", "--max-ppl", "30")
    assert code == EXIT_GATE_FAILED, out + err
    assert "gate failed: ppl at s = 0.25 (law, " in err and "(max 30)" in err
    assert "law" in out and "measured" in out  # the table names the rungs
    code, out, err = predict(capsys, server, "--sparsity", "0.1", "--sparsity", "0.25", "--max-ppl", "45")
    assert code == EXIT_OK, out + err
    assert "gate ok: ppl at s = 0.1 (measured, measured) is 29.33" in out
    assert out.count("gate ok: ppl at s = ") == 2
    # the band's far end can be gated on instead; the strict law only by name
    code, out, err = predict(capsys, server, "--sparsity", "0.25", "--max-ppl", "39.5", "--band")
    assert code == EXIT_GATE_FAILED, out + err
    code, out, err = predict(capsys, server, "--sparsity", "0.25", "--max-ppl", "45", "--rung", "strict")
    assert code == EXIT_GATE_FAILED and "(strict, " in err, out + err


def test_predict_json_carries_the_answer_and_the_gate(
    server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = predict(capsys, server, "--sparsity", "0.25", "--max-ppl", "30", "--json")
    body = json.loads(out)
    assert code == EXIT_GATE_FAILED and body["gates"]["passed"] is False
    assert body["metrics"][0]["predictions"][0]["sparsity"] == 0.25


def test_predict_with_an_unknown_baseline_or_bad_flags_exits_3(
    server: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(["predict", "--model", "nobody/never", "--sparsity", "0.2", "--server", server])
    problem = json.loads(capsys.readouterr().out)
    assert code == EXIT_USAGE and problem["status"] == 409 and problem["job"]["kind"] == "simulate"
    code, _, err = predict(capsys, server, "--sparsity", "0.2", "--metric", "acc")
    assert code == EXIT_USAGE and "--task" in err
    code, out, _ = predict(capsys, server, "--sparsity", "1.5")
    assert code == EXIT_USAGE and json.loads(out)["status"] == 422
    assert (
        main(["predict", "--model", OPT, "--sparsity", "0.2", "--server", "http://127.0.0.1:9"]) == EXIT_USAGE
    )


def test_predict_accuracy_drop_gate_with_your_points(
    server: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    points: list[dict[str, Any]] = [
        {"metric": "acc", "task": "arc_easy", "sparsity": s, "value": v, "n_options": 4}
        for s, v in ((0.0, 0.60), (0.2, 0.56), (0.3, 0.52))
    ]
    points_file = tmp_path / "points.json"
    points_file.write_text(json.dumps(points))
    common = ["--sparsity", "0.25", "--task", "arc_easy", "--points", str(points_file)]
    code, out, err = predict(capsys, server, *common, "--max-acc-drop", "0.05")
    assert code == EXIT_GATE_FAILED and "acc on arc_easy at s = 0.25" in err, out + err
    code, out, err = predict(capsys, server, *common, "--max-acc-drop", "0.10")
    assert code == EXIT_OK, out + err


def test_submit_wait_gates_use_the_jobs_measured_results(
    make_settings: Callable[..., Settings],
    tiny_model_dir: Path,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    from core.migrate import upgrade

    settings = make_settings()  # embedded: SQLite + in-process worker runs the job
    upgrade(settings.store_url)
    job = {"kind": "evaluate", "model": str(tiny_model_dir), "perplexity": {"seqlen": 64, "max_windows": 2}}
    with live_server(settings) as url:
        base = ["submit", json.dumps(job), "--wait", "--server", url, "--timeout", "120"]
        code = main([*base, "--max-ppl", "1.5"])  # a random tiny model is far above 1.5
        body = json.loads(capsys.readouterr().out)
        assert code == EXIT_GATE_FAILED and body["gates"]["passed"] is False
        assert main([*base, "--max-ppl", "1e9"]) == EXIT_OK
        assert json.loads(capsys.readouterr().out)["gates"]["passed"] is True
        assert main([*base, "--max-acc-drop", "0.05"]) == EXIT_GATE_FAILED  # nothing to check fails
        capsys.readouterr()
        assert main(["submit", json.dumps(job), "--server", url, "--max-ppl", "3"]) == EXIT_USAGE


def test_usage_errors_exit_3_not_argparses_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["predict", "--sparsity", "0.2"], ["predict", "--model", "m"], ["teleport"]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == EXIT_USAGE, argv
    assert "--model" in capsys.readouterr().err


def test_predict_passes_the_calibration_and_precision_the_queued_job_is_to_use(tmp_path: Path) -> None:
    calibration = tmp_path / "calibration.json"
    calibration.write_text(json.dumps({"corpus": "c4", "num_sequences": 16}))
    argv = ["predict", "--model", OPT, "--sparsity", "0.3", "--measure-missing", "--precision", "0.05"]
    body = _predict_body(build_parser().parse_args([*argv, "--calibration", f"@{calibration}"]))
    assert body["calibration"] == {"corpus": "c4", "num_sequences": 16} and body["precision"] == 0.05
    every = _predict_body(build_parser().parse_args([*argv[:-1], "all", "--calibration", '{"seed": 3}']))
    assert every["precision"] is None and every["calibration"] == {"seed": 3}
    with pytest.raises(ValueError, match="--calibration takes a JSON object"):
        _predict_body(build_parser().parse_args([*argv, "--calibration", "[1, 2]"]))


def test_the_strict_laws_note_is_printed_only_under_an_answer_from_a_law(
    server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _, measured_only, _ = predict(capsys, server, "--sparsity", "0.1", "--sparsity", "0.2")
    assert "the strict law" not in measured_only
    _, from_a_law, _ = predict(capsys, server, "--sparsity", "0.25")
    assert "law" in from_a_law and "the strict law" in from_a_law
