"""The profile measures what slicing would discard: spectra of the signals slicing's PCAs see, and
lens readings computed exactly as the probes compute deviations."""

from __future__ import annotations

import pytest
import torch
from transformers import PreTrainedModel

from core.profiles import LensMeans, SignalSpectrum
from tests.workers.slicing.tiny import build, token_ids
from workers.architectures import detect_family
from workers.probing.deviation import probability_deviations
from workers.profiling import ProfileStopped, SignalProfile, profile_model


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """Tiny models: one torch thread (tests/workers/conftest.py)."""


def _spectrum(signal: SignalProfile) -> SignalSpectrum:
    lens = {r.width: LensMeans(r.kl, r.kl_taylor, r.nll_increase) for r in signal.lens}
    return SignalSpectrum(
        signal.index,
        signal.kind,
        signal.layer,
        tuple(signal.eigenvalues),
        tuple(signal.token_energy),
        lens,
        energy=tuple(signal.energy),
    )


def _rank_limited_identity_blocks(rank: int) -> PreTrainedModel:
    """A tiny Llama whose embeddings span `rank` dimensions and whose blocks add nothing (their
    writers are zero), so every residual signal has rank `rank`."""
    model = build("llama")
    with torch.no_grad():
        embedding = model.get_input_embeddings().weight  # (V, D)
        generator = torch.Generator().manual_seed(3)
        low = torch.randn(embedding.shape[0], rank, generator=generator) @ torch.randn(
            rank, embedding.shape[1], generator=generator
        )
        embedding.copy_(low / low.norm(dim=-1, keepdim=True))
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return model


def test_discarded_energy_of_a_low_rank_stream_is_zero_at_its_rank() -> None:
    rank = 16
    model = _rank_limited_identity_blocks(rank)
    report = profile_model(model, token_ids(4, 16), None, [0.75, 0.875], round_to=8, batch_size=2)
    assert report.widths == [rank, 8]
    assert [s.name for s in report.signals] == [
        "embedding",
        "block 0 pre-mlp",
        "block 0 output",
        "block 1 pre-mlp",
        "block 1 output",
    ]
    for signal in map(_spectrum, report.signals):
        assert signal.discarded(rank) < 1e-9
        assert signal.token_discarded(rank) < 1e-7  # its moment's products are float32
        assert signal.discarded(rank - 4) > 1e-3
        assert signal.lens[rank].kl < 1e-6  # float32 logits: projecting on the span changes nothing
        assert signal.lens[8].kl > 1e-3


@pytest.mark.parametrize("case", ["llama", "gemma3"])
def test_eigenvalues_are_those_of_the_uncentred_second_moment(case: str) -> None:
    """Of the stream the MLP norm reads and of the block output, as the dense model computes them
    (Gemma: after the attention branch's output norm)."""
    model = build(case)
    ids = token_ids(4, 16)
    report = profile_model(model, ids, None, [0.5], batch_size=3)
    adapter = detect_family(model)
    seen: list[torch.Tensor] = []
    hook = adapter.mlp_norm(adapter.blocks(model)[0]).register_forward_pre_hook(
        lambda _module, args: seen.append(args[0].detach())
    )
    with torch.no_grad():
        hidden = model(input_ids=ids, output_hidden_states=True).hidden_states[1]  # block 0 output
    hook.remove()
    for name, stream in (("block 0 pre-mlp", seen[0]), ("block 0 output", hidden)):
        x = stream.double().reshape(-1, stream.shape[-1])
        expected = torch.linalg.eigvalsh(x.T @ x / x.shape[0]).flip(0)
        signal = next(s for s in report.signals if s.name == name)
        assert torch.allclose(
            torch.tensor(signal.eigenvalues, dtype=torch.float64), expected, rtol=1e-5, atol=1e-9
        ), name
        assert sum(signal.token_energy) == pytest.approx(1.0, abs=1e-9)
        # The token energy: each eigenvector's share of sum u u^T over the unit rows u = x / |x|.
        unit = x / x.norm(dim=-1, keepdim=True)
        vectors = torch.linalg.eigh(x.T @ x)[1].flip(1)
        shares = (vectors.T @ unit.T @ unit @ vectors).diagonal()
        assert signal.token_energy == pytest.approx((shares / shares.sum()).tolist(), abs=1e-7), name


def test_lens_readings_equal_the_probe_deviations_of_the_projected_signal() -> None:
    model = build("llama")
    ids = token_ids(3, 12)
    lens_tokens = 20
    report = profile_model(model, ids, None, [0.25, 0.5], batch_size=2, lens_tokens=lens_tokens)
    with torch.no_grad():
        hidden = model(input_ids=ids, output_hidden_states=True).hidden_states[1]  # (N, T, D)
        x = hidden.double().reshape(-1, hidden.shape[-1])
        _, vectors = torch.linalg.eigh(x.T @ x)
        vectors = vectors.flip(1)  # descending
        # The lens positions: every position from 1 on with a next token, row by row (30 of them),
        # of which 20 are taken evenly spaced, so every window is read.
        usable = torch.cat([hidden[n, 1:-1] for n in range(ids.shape[0])])  # (30, D)
        next_ids = torch.cat([ids[n, 2:] for n in range(ids.shape[0])])
        picked = [int((k + 0.5) * usable.shape[0] / lens_tokens) for k in range(lens_tokens)]
        assert {p // 10 for p in picked} == {0, 1, 2}
        rows, labels = usable[picked], next_ids[picked]  # (20, D), (20,)

        def read(h: torch.Tensor) -> torch.Tensor:
            return model.lm_head(model.model.norm(h)).float()

        signal = next(s for s in report.signals if s.name == "block 0 output")
        for reading in signal.lens:
            basis = vectors[:, : reading.width]
            projected = (rows.double() @ basis @ basis.T).float()
            kl = probability_deviations(read(rows), read(projected))[1]
            assert kl.estimates is not None
            nll = torch.nn.functional.cross_entropy(read(projected), labels, reduction="none")
            nll0 = torch.nn.functional.cross_entropy(read(rows), labels, reduction="none")
            assert reading.kl == pytest.approx(float(kl.values.mean()), rel=1e-4)
            assert reading.kl_taylor == pytest.approx(float(kl.estimates.mean()), rel=1e-4)
            assert reading.nll_increase == pytest.approx(float((nll - nll0).mean()), rel=1e-4, abs=1e-7)
    assert report.lens_tokens == lens_tokens


def test_layernorm_signals_are_profiled_centred_as_slicing_sees_them() -> None:
    report = profile_model(build("opt"), token_ids(4, 16), None, [0.5], batch_size=2)
    for signal in report.signals:
        # Centred tokens have no energy along the all-ones direction: the last eigenvalue is 0.
        assert signal.eigenvalues[-1] < 1e-9 * signal.eigenvalues[0]


def test_profiling_leaves_the_model_unchanged_and_reports_blocks() -> None:
    model = build("qwen2")
    ids = token_ids(2, 16)
    with torch.no_grad():
        before = model(input_ids=ids).logits
    seen: list[tuple[int, int]] = []
    profile_model(
        model, ids, None, [0.5], batch_size=1, progress=lambda done, total: seen.append((done, total))
    )
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, before)
    assert seen == [(0, 2), (1, 2), (2, 2)]


def test_profiling_stops_before_a_block_when_asked() -> None:
    asked = iter([False, True])
    with pytest.raises(ProfileStopped, match="before block 1"):
        profile_model(build("llama"), token_ids(2, 8), None, [0.5], should_stop=lambda: next(asked))


def test_no_lens_tokens_means_spectra_only() -> None:
    report = profile_model(build("llama"), token_ids(2, 8), None, [0.5], lens_tokens=0)
    assert report.lens_tokens == 0
    assert all(signal.lens == [] and signal.eigenvalues for signal in report.signals)


def test_measured_windows_keep_the_calibration_basis_and_measure_what_it_discards_on_them() -> None:
    model, ids = build("llama"), token_ids(4, 16)
    alone = profile_model(model, ids, None, [0.5], batch_size=2, lens_tokens=20)
    same = profile_model(model, ids, None, [0.5], batch_size=2, lens_tokens=20, measured_ids=ids)
    other = profile_model(
        model, ids, None, [0.5], batch_size=2, lens_tokens=20, measured_ids=token_ids(4, 16, seed=9)
    )
    for a, b, c in zip(alone.signals, same.signals, other.signals, strict=True):
        total = sum(a.eigenvalues)
        assert a.energy == pytest.approx([v / total for v in a.eigenvalues], abs=1e-9)
        assert b.energy == pytest.approx(a.energy, abs=1e-9) and b.lens == a.lens
        assert b.token_energy == pytest.approx(a.token_energy, abs=1e-9)  # from the measured windows
        assert c.eigenvalues == a.eigenvalues  # the basis is the calibration's
        held_out, in_sample = _spectrum(c).discarded(32), _spectrum(a).discarded(32)
        assert held_out != pytest.approx(in_sample, rel=1e-3)
    assert other.measured_tokens == 64
    # mask errors: the calibration's masks (its squares alone), measured on the measured windows' moments
    for a, b, c in zip(alone.linears, same.linears, other.linears, strict=True):
        assert b.output_energy == pytest.approx(a.output_energy)
        assert all(b.errors[rule] == pytest.approx(a.errors[rule], rel=1e-6) for rule in a.errors)
        assert c.output_energy != pytest.approx(a.output_energy, rel=1e-3)
