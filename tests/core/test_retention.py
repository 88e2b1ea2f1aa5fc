"""The retention view pairs each pruned score with its own dense result, inverts perplexities, and
says when generation breaks before multiple choice."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest

from core.retention import retention, verdict
from core.tasks import FLEXIBLE_EXTRACT, STRICT_MATCH


@dataclass
class Row:
    id: int
    method: str
    sparsity: float
    metric: str
    dataset: str
    value: float
    stderr: float | None = 0.01
    n: int | None = 100
    protocol: dict[str, object] = field(default_factory=dict)


def dense_and_pruned(
    dense: list[tuple[str, str, float]],
    pruned: list[tuple[str, str, float]],
    method: str = "wanda",
    s: float = 0.5,
) -> tuple[list[Row], list[Row]]:
    dense_rows = [
        Row(i + 1, "dense", 0.0, metric, task, value) for i, (task, metric, value) in enumerate(dense)
    ]
    by_key = {(r.dataset, r.metric): r for r in dense_rows}
    pruned_rows = [
        Row(100 + i, method, s, metric, task, value, protocol={"dense_result_id": by_key[(task, metric)].id})
        for i, (task, metric, value) in enumerate(pruned)
    ]
    return dense_rows, pruned_rows


def test_retained_is_pruned_over_dense_for_scores_and_dense_over_pruned_for_perplexities() -> None:
    dense, pruned = dense_and_pruned(
        [
            ("arc_easy", "acc", 0.5),
            ("lambada_openai", "acc", 0.4),
            ("wikitext2", "ppl", 20.0),
            ("lambada_openai", "perplexity", 60.0),
            ("arc_easy", "acc_norm", 0.45),
        ],
        [
            ("arc_easy", "acc", 0.45),
            ("lambada_openai", "acc", 0.1),
            ("wikitext2", "ppl", 40.0),
            ("lambada_openai", "perplexity", 600.0),
            ("arc_easy", "acc_norm", 0.3),
        ],
    )
    (answer,) = retention(pruned, dense)
    scores = {(s.dataset, s.metric): s for s in answer.scores}
    assert set(scores) == {
        ("arc_easy", "acc"),
        ("lambada_openai", "acc"),
        ("wikitext2", "ppl"),
        ("lambada_openai", "perplexity"),
    }  # acc_norm is not arc_easy's headline metric
    assert scores[("arc_easy", "acc")].retained == pytest.approx(0.9)
    assert scores[("arc_easy", "acc")].family == "multiple_choice"
    assert scores[("lambada_openai", "acc")].family == "generative"
    assert scores[("wikitext2", "ppl")].retained == pytest.approx(0.5)
    assert scores[("lambada_openai", "perplexity")].retained == pytest.approx(0.1)
    assert scores[("lambada_openai", "perplexity")].family == "perplexity"
    expected_se = 0.9 * math.hypot(0.01 / 0.45, 0.01 / 0.5)
    assert scores[("arc_easy", "acc")].stderr == pytest.approx(expected_se)
    assert answer.means["generative"].retained == pytest.approx(0.25)
    assert answer.means["perplexity"].retained == pytest.approx(0.3)
    assert answer.verdict.startswith("generation breaks first")


def test_gsm8k_counts_by_its_flexible_filter_and_a_dense_score_at_the_floor_is_skipped() -> None:
    dense, pruned = dense_and_pruned(
        [("gsm8k", FLEXIBLE_EXTRACT, 0.0), ("gsm8k", STRICT_MATCH, 0.0), ("piqa", "acc", 0.6)],
        [("gsm8k", FLEXIBLE_EXTRACT, 0.0), ("gsm8k", STRICT_MATCH, 0.0), ("piqa", "acc", 0.6)],
    )
    (answer,) = retention(pruned, dense)
    assert [s.dataset for s in answer.scores] == ["piqa"]
    assert answer.skipped == (
        f"gsm8k {FLEXIBLE_EXTRACT}: the dense model scores 0, at the task's floor: no skill to lose",
    )
    assert answer.verdict.startswith("no generative task was measured")


def test_only_the_paired_dense_result_counts_and_the_newest_pruned_row_wins() -> None:
    dense, pruned = dense_and_pruned(
        [("piqa", "acc", 0.6), ("lambada_openai", "acc", 0.3)], [("piqa", "acc", 0.54)]
    )
    older = Row(50, "wanda", 0.5, "acc", "lambada_openai", 0.0)  # no dense_result_id: ignored
    newer = Row(200, "wanda", 0.5, "acc", "lambada_openai", 0.27, protocol={"dense_result_id": dense[1].id})
    stale = Row(150, "wanda", 0.5, "acc", "lambada_openai", 0.03, protocol={"dense_result_id": dense[1].id})
    (answer,) = retention([*pruned, older, stale, newer], dense)
    generative = [s for s in answer.scores if s.family == "generative"]
    assert [s.result_id for s in generative] == [200] and generative[0].retained == pytest.approx(0.9)
    assert answer.verdict.startswith("no clear difference")


def test_prunings_are_grouped_by_method_and_sparsity_in_order() -> None:
    d1, p1 = dense_and_pruned([("piqa", "acc", 0.6)], [("piqa", "acc", 0.5)], "wanda", 0.5)
    _, p2 = dense_and_pruned([("piqa", "acc", 0.6)], [("piqa", "acc", 0.55)], "slicegpt", 0.25)
    for row in p2:
        row.id += 50
    answers = retention([*p1, *p2], d1)
    assert [(a.method, a.sparsity) for a in answers] == [("slicegpt", 0.25), ("wanda", 0.5)]


def test_verdict_needs_both_families_and_a_gap_beyond_twice_the_combined_stderr() -> None:
    from core.retention import FamilyMean

    choice = FamilyMean("multiple_choice", 0.95, 0.02, ("piqa",))
    assert "no multiple-choice task" in verdict({"generative": choice})
    close = FamilyMean("generative", 0.9, 0.02, ("lambada_openai",))
    assert verdict({"multiple_choice": choice, "generative": close}).startswith("no clear difference")
    far = FamilyMean("generative", 0.8, 0.02, ("lambada_openai",))
    assert verdict({"multiple_choice": choice, "generative": far}).startswith("generation breaks first")
    reverse = FamilyMean("generative", 1.1, 0.02, ("lambada_openai",))
    assert verdict({"multiple_choice": choice, "generative": reverse}).startswith(
        "multiple choice breaks first"
    )
