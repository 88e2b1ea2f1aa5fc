"""Prompts the probes use when a job brings none: short, varied, and quick to run.

Four multiple-choice questions (lettered options, ending "Answer:"; options A-D), four sums and
four open starts for generation.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProbePrompt:
    text: str
    options: tuple[str, ...] | None = None  # answer labels: present => a multiple-choice prompt


_LETTERS = ("A", "B", "C", "D")


def _choice(question: str, answers: tuple[str, str, str, str]) -> ProbePrompt:
    lines = [f"Question: {question}"] + [
        f"{letter}. {answer}" for letter, answer in zip(_LETTERS, answers, strict=True)
    ]
    return ProbePrompt("\n".join([*lines, "Answer:"]), _LETTERS)


BUILTIN_PROMPTS: tuple[ProbePrompt, ...] = (
    _choice("Which planet is known as the Red Planet?", ("Venus", "Mars", "Jupiter", "Saturn")),
    _choice(
        "What do plants take in from the air to make food?",
        ("Oxygen", "Nitrogen", "Carbon dioxide", "Helium"),
    ),
    _choice("Which of these is a mammal?", ("Shark", "Eagle", "Frog", "Dolphin")),
    _choice("What is the boiling point of water at sea level?", ("50 °C", "100 °C", "150 °C", "200 °C")),
    ProbePrompt("17 + 25 ="),
    ProbePrompt("48 + 36 ="),
    ProbePrompt("9 * 7 ="),
    ProbePrompt("100 - 58 ="),
    ProbePrompt("The capital of France is"),
    ProbePrompt("Once upon a time, in a small village by the sea,"),
    ProbePrompt("The three primary colors are"),
    ProbePrompt("To make a cup of tea, first"),
)
