"""The paired-doc estimator of a task score: exact with every doc, a band that never claims zero width
from a subset, that covers the every-doc score as often as it claims, and stopping that obeys the
precision asked for."""

from __future__ import annotations

import math
import random

import pytest

from core.prediction.paired_docs import (
    FIRST_DOCS,
    STEP_DOCS,
    doc_order,
    estimate_score,
    score_to_precision,
)


def _population(count: int, seed: int, flips: float = 0.15) -> tuple[list[float], list[float]]:
    """Dense and pruned right-or-wrong per doc: the pruned model flips a share of the dense answers,
    more often from right to wrong."""
    rng = random.Random(seed)
    dense = [float(rng.random() < 0.6) for _ in range(count)]
    pruned = []
    for right in dense:
        flip = rng.random() < (flips * 1.5 if right else flips * 0.5)
        pruned.append(1.0 - right if flip else right)
    return dense, pruned


def test_every_doc_gives_the_every_doc_score_exactly_and_no_band() -> None:
    dense, pruned = _population(200, seed=1)
    order = doc_order(200, seed=3)
    found = estimate_score({i: pruned[i] for i in order}, dense)
    assert found.value == sum(pruned) / 200 and found.stderr == 0.0 and found.complete
    assert found.low == found.high == found.value


def test_a_subset_estimates_the_dense_score_plus_the_mean_flip() -> None:
    """Hand-checked: dense 0.75 over 8 docs; on 4 docs one right answer lost, none gained."""
    dense = [1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    scored = {0: 1.0, 1: 0.0, 2: 1.0, 3: 0.0}
    found = estimate_score(scored, dense)
    assert found.value == pytest.approx(0.75 - 1 / 4) and (found.gains, found.losses) == (0, 1)
    p_gain, p_loss = 0.5 / 6, 1.5 / 6  # 0.5 added to each cell of the 2 x 2 table, k + 2 = 6
    variance = (p_gain + p_loss - (p_gain - p_loss) ** 2) / 6
    assert found.stderr == pytest.approx(math.sqrt(variance * (8 - 4) / (8 - 1)))


def test_a_subset_without_a_flip_still_claims_a_band() -> None:
    dense = [float(i % 2) for i in range(500)]
    found = estimate_score({i: dense[i] for i in range(FIRST_DOCS)}, dense)
    assert found.value == 0.5 and found.stderr > 0.0
    assert found.half_width > 0.05  # 32 docs without a flip rule out no flip of ±5 points


def test_the_seeded_order_is_reproducible_and_covers_every_doc_once() -> None:
    assert doc_order(300, seed=9) == doc_order(300, seed=9) != doc_order(300, seed=10)
    assert sorted(doc_order(300, seed=9)) == list(range(300))


@pytest.mark.parametrize("flips", [0.05, 0.2])
def test_the_band_covers_the_every_doc_score_about_as_often_as_it_claims(flips: float) -> None:
    hits, draws = 0, 0
    for population_seed in range(20):
        dense, pruned = _population(400, seed=population_seed, flips=flips)
        truth = sum(pruned) / len(pruned)
        for draw in range(50):
            order = doc_order(400, seed=1000 * population_seed + draw)[:64]
            found = estimate_score({i: pruned[i] for i in order}, dense)
            hits += found.low <= truth <= found.high
            draws += 1
    assert 0.92 <= hits / draws <= 0.995


def test_scoring_stops_at_the_first_look_that_reaches_the_precision() -> None:
    dense, pruned = _population(1000, seed=5, flips=0.1)
    looks: list[tuple[int, float]] = []
    asked: list[list[int]] = []

    def score(indices: list[int]) -> dict[str, list[float]]:
        asked.append(indices)
        return {"acc": [pruned[i] for i in indices]}

    found = score_to_precision(
        score,
        {"acc": dense},
        0.04,
        order_seed=2,
        on_look=lambda e: looks.append((e["acc"].docs, e["acc"].half_width)),
    )["acc"]
    assert [len(batch) for batch in asked] == [FIRST_DOCS] + [STEP_DOCS] * (len(asked) - 1)
    assert [i for batch in asked for i in batch] == doc_order(1000, seed=2)[: found.docs]
    assert looks[-1] == (found.docs, found.half_width) and found.half_width <= 0.04
    assert all(width > 0.04 for _, width in looks[:-1]) and found.docs < 1000


def test_a_precision_out_of_reach_scores_every_doc_and_gives_the_exact_score() -> None:
    dense, pruned = _population(60, seed=6, flips=0.3)
    found = score_to_precision(lambda ix: {"acc": [pruned[i] for i in ix]}, {"acc": dense}, 1e-6, 4)["acc"]
    assert found.complete and found.value == sum(pruned) / 60 and found.stderr == 0.0


def test_every_metric_must_reach_the_precision() -> None:
    dense, pruned = _population(800, seed=7, flips=0.02)
    noisy_dense, noisy = _population(800, seed=8, flips=0.4)
    found = score_to_precision(
        lambda ix: {"quiet": [pruned[i] for i in ix], "noisy": [noisy[i] for i in ix]},
        {"quiet": dense, "noisy": noisy_dense},
        0.05,
        order_seed=1,
    )
    alone = score_to_precision(lambda ix: {"quiet": [pruned[i] for i in ix]}, {"quiet": dense}, 0.05, 1)
    assert found["noisy"].half_width <= 0.05 and found["quiet"].docs > alone["quiet"].docs
