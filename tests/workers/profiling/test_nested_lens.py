"""The lens at nested widths by prefix sums gives the logits the plain head gives each projection,
for every norm form the families use, and the profile's readings do not depend on which path read
them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.workers.slicing.tiny import HIDDEN, build, relative_error, token_ids
from workers.architectures import match_structure
from workers.probing.head import Float32Head
from workers.profiling import profile_model
from workers.profiling.nested_lens import AffineNorm, NestedWidthLogits


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """Tiny models: one torch thread (tests/workers/conftest.py)."""


def _basis(width: int, seed: int) -> torch.Tensor:
    """An orthonormal (D, D) float64 basis: the eigenvectors of a random SPD matrix."""
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(width, width, dtype=torch.float64, generator=generator)
    return torch.linalg.eigh(a @ a.T)[1].flip(-1)


def _rows(count: int, seed: int) -> torch.Tensor:
    """(n, D) float32 rows with a mean far from zero, so that centring matters."""
    generator = torch.Generator().manual_seed(seed)
    return 3.0 * torch.randn(count, HIDDEN, generator=generator) + torch.linspace(-2.0, 4.0, HIDDEN)


@pytest.mark.parametrize("case", ["llama", "opt", "gpt2", "phi", "gemma3", "gemma3-softcap"])
def test_prefix_sums_give_each_projections_plain_logits(case: str) -> None:
    model = build(case.removesuffix("-softcap"))
    if case.endswith("softcap"):
        model.config.final_logit_softcapping = 2.0  # read by Float32Head, as Gemma-2 sets it
    head = Float32Head(match_structure(model), model)
    rows, vectors, widths = _rows(24, 1), _basis(HIDDEN, 2), [16, 40, 56]
    norm = AffineNorm.read_off(head.norm, HIDDEN, head.device)
    assert norm is not None and norm.centred == isinstance(head.norm, nn.LayerNorm)
    assert norm.matches(head.norm, rows)
    nested = NestedWidthLogits(head, norm, vectors, widths)
    assert nested.edges == [*widths, HIDDEN]
    for width, got in zip(nested.edges, nested.logits(rows), strict=True):
        projected = (rows.double() @ vectors[:, :width] @ vectors[:, :width].T).float()
        assert relative_error(got, head(projected)) < 2e-6, width


class _MaxNorm(nn.Module):
    """A norm of another form: divides by the largest entry, not by the RMS."""

    eps = 1e-6

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden / hidden.abs().amax(-1, keepdim=True)


def test_a_norm_of_another_form_is_not_taken_for_an_affine_one() -> None:
    rows = _rows(8, 3)
    other = AffineNorm.read_off(_MaxNorm(), HIDDEN, torch.device("cpu"))
    assert other is not None and not other.matches(_MaxNorm(), rows)
    assert AffineNorm.read_off(nn.Identity(), HIDDEN, torch.device("cpu")) is None  # no epsilon


def test_the_cost_rule_prefers_prefix_sums_for_narrow_models_read_at_many_widths() -> None:
    assert NestedWidthLogits.pays(tokens=256, vocab=49_152, full=576, widths=[288, 344, 400, 456, 512])
    assert not NestedWidthLogits.pays(tokens=256, vocab=128_256, full=4096, widths=[2048, 3072])
    assert not NestedWidthLogits.pays(tokens=8, vocab=49_152, full=576, widths=[288])  # too few tokens


@pytest.mark.parametrize("case", ["llama", "opt"])
def test_the_profiles_lens_readings_are_the_same_on_either_path(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = build(case)

    def profile(nested: bool) -> tuple[list[float], int, int]:
        monkeypatch.setattr(NestedWidthLogits, "pays", staticmethod(lambda *args, **kwargs: nested))
        report = profile_model(
            model, token_ids(4, 16), None, [0.25, 0.5, 0.75], batch_size=2, lens_tokens=40, mask_rules=()
        )
        readings = [v for s in report.signals for r in s.lens for v in (r.kl, r.kl_taylor, r.nll_increase)]
        return readings, report.timings["lens_nested_signals"], len(report.signals)

    (plain, none, _), (nested, read, signals) = profile(False), profile(True)
    assert none == 0 and read == signals  # every signal read by prefix sums
    assert min(plain[0::3]) > 0.0 and len(nested) == len(plain) == 9 * signals  # KL, estimate, NLL
    assert nested == pytest.approx(plain, rel=1e-3, abs=1e-8)  # float32 rounding of KL ~1e-4
