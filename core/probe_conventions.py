"""Probe conventions: the rules a deviation probe reads its numbers by (docs/science.md §3).

Two readers of the same research measure different numbers: the paper's text reads every
intermediate hidden state through the final norm and head in float32 and takes KL(dense || pruned)
everywhere, while the authors' released code reads the dense `lm_head` straight off the hidden state
(no final norm, the model's dtype), takes KL(pruned || dense) per sublayer, weights its Taylor
estimates by the pruned distribution, probes at T = 0.5 and only at the last token of each decoding
step. A probe job names its convention; it is recorded in the job's protocol and in every stored
point, so that summaries, plots and the retention view never mix the two.

Torch-free: the API validates and documents the names; `workers.probing` applies the rules.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal, get_args

ProbeConventionName = Literal["prunecast", "released-code"]
PROBE_CONVENTIONS: tuple[str, ...] = get_args(ProbeConventionName)
DEFAULT_CONVENTION: ProbeConventionName = "prunecast"

Reference = Literal["dense", "pruned"]


@dataclass(frozen=True)
class ProbeConvention:
    """What one convention does where the two differ. Every field is a rule a test pins down."""

    name: ProbeConventionName
    temperature: float  # the default T of p = softmax(z / T) when the job gives none
    lens_final_norm: bool  # intermediate (per-layer) logit readings apply the final norm first
    float32_head: bool  # logit readings in float32 (else in the model's dtype, as loaded)
    sublayer_reference: Reference  # per-sublayer KL(ref || other) and its estimate's weights
    decoding_steps_only: bool  # the counterfactual reads only the last token of each decoding step
    sampled_driver: bool  # the dense model samples at T to drive those steps (else greedy)
    option_letters: tuple[str, ...] | None  # a second multiple-choice subspace of these tokens
    source: str  # where the rules come from

    def rules(self) -> dict[str, object]:
        """The rules as a probe job's protocol records them."""
        return {key: value for key, value in asdict(self).items() if key != "name"}


PRUNECAST = ProbeConvention(
    name="prunecast",
    temperature=1.0,
    lens_final_norm=True,
    float32_head=True,
    sublayer_reference="dense",
    decoding_steps_only=False,
    sampled_driver=False,
    option_letters=None,
    source="the paper's text: final norm and head in float32, KL(dense || pruned) everywhere",
)
RELEASED_CODE = ProbeConvention(
    name="released-code",
    temperature=0.5,
    lens_final_norm=False,
    float32_head=False,
    sublayer_reference="pruned",
    decoding_steps_only=True,
    sampled_driver=True,
    option_letters=(" a", " b", " c", " d"),
    source="the authors' released code (CASE-Lab-UMD/Pruning-on-Representations at ba1c25b)",
)
CONVENTIONS: dict[str, ProbeConvention] = {
    convention.name: convention for convention in (PRUNECAST, RELEASED_CODE)
}
if tuple(CONVENTIONS) != PROBE_CONVENTIONS:
    raise RuntimeError(f"probe conventions {tuple(CONVENTIONS)} differ from the API's {PROBE_CONVENTIONS}")

CONVENTION_DESCRIPTION = (
    "The rules the probe reads its numbers by. `prunecast` (the default): the paper's text; every "
    "logit reading goes through the final norm and the head in float32, KL is KL(dense || pruned) "
    "everywhere with Taylor estimates weighted by the dense distribution, and the counterfactual reads "
    "every prompt position but the first. `released-code`: what the authors' released code does; "
    "intermediate readings apply the dense `lm_head` straight to the hidden state (no final norm, in "
    "the model's dtype), KL per sublayer is KL(pruned || dense) with estimates weighted by the pruned "
    "distribution (the output and the multiple-choice subspace keep KL(dense || pruned)), the "
    "counterfactual reads only the last token of each decoding step while the dense model samples at "
    "T, and the multiple-choice probe also restricts p to the tokens ' a' .. ' d'. Default "
    "temperature: 1.0 and 0.5."
)


def convention_named(name: str) -> ProbeConvention:
    """The convention called `name`; ValueError naming the known ones otherwise."""
    try:
        return CONVENTIONS[name]
    except KeyError:
        raise ValueError(f"unknown probe convention {name!r}; known: {', '.join(CONVENTIONS)}") from None
