"""The answer is the first rung, best first, with a finite value; a rung asked for by name answers
alone; the strict law answers only when asked for."""

from __future__ import annotations

from core.prediction.records import Verdict
from core.prediction.rungs import STRICT, Estimate, Rung, best

UNSCORED = Verdict("unscored", "")


def estimate(rung: Rung | str, value: float | None) -> Estimate:
    return Estimate(rung, 0.3, value, None, str(rung), "", UNSCORED)


def test_the_best_rung_that_answers_is_the_answer() -> None:
    found = [
        estimate(Rung.MEASURED, None),
        estimate(Rung.SIMULATED, 40.0),
        estimate(Rung.PROFILE, 90.0),
        estimate(Rung.LAW, 30.0),
        estimate(STRICT, 35.0),
    ]
    chosen = best(found)
    assert chosen is not None and chosen.rung == Rung.SIMULATED  # never the profile over a simulation
    assert best(list(reversed(found))) == chosen  # order of the list does not matter
    named = best(found, "law")
    assert named is not None and named.value == 30.0


def test_the_strict_law_answers_only_by_name() -> None:
    found = [estimate(Rung.LAW, None), estimate(STRICT, 35.0)]
    assert best(found) is None
    strict = best(found, STRICT)
    assert strict is not None and strict.value == 35.0


def test_an_infinite_value_is_no_answer() -> None:
    assert best([estimate(Rung.LAW, float("inf"))]) is None
