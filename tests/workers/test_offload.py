"""Offloaded execution: the memory plan, blocks streamed one at a time with the in-memory numbers,
and the engines running with the streaming suspended."""

from __future__ import annotations

import pytest
import torch

from tests.workers.pruning.tiny import build, calibration
from workers.architectures import match_structure
from workers.offload import OffloadError, module_bytes, offload, offloaded, plan_memory, suspended
from workers.pruning import prune_model
from workers.slicing.engine import slice_model

CPU = torch.device("cpu")


def _sizes(model: torch.nn.Module) -> tuple[int, int, int]:
    """(model bytes, resident bytes, largest block bytes)."""
    blocks = match_structure(model).blocks(model)
    sizes = [module_bytes(block) for block in blocks]
    return module_bytes(model), module_bytes(model) - sum(sizes), max(sizes)


def test_the_plan_keeps_a_model_whole_while_it_fits_and_offloads_it_past_80_percent() -> None:
    model = build("llama", layers=4)
    blocks = match_structure(model).blocks(model)
    total, resident, largest = _sizes(model)
    whole = plan_memory(model, blocks, CPU, "auto", int(total / 0.8) + 1)
    assert not whole.offloaded and whole.model_bytes == total
    assert whole.budget_source == "PRUNECAST_DEVICE_MEMORY_BYTES"
    streamed = plan_memory(model, blocks, CPU, "auto", total)
    assert (
        streamed.offloaded and streamed.resident_bytes == resident and streamed.largest_block_bytes == largest
    )
    assert "streamed through the device one at a time" in streamed.reason
    assert not plan_memory(model, blocks, CPU, "auto", None).offloaded  # a CPU without a budget
    assert plan_memory(model, blocks, CPU, "always", None).offloaded


def test_the_plan_refuses_what_cannot_run_and_says_why() -> None:
    model = build("llama", layers=4)
    blocks = match_structure(model).blocks(model)
    total, resident, largest = _sizes(model)
    with pytest.raises(OffloadError, match="offload 'never' was asked"):
        plan_memory(model, blocks, CPU, "never", total - 1)
    with pytest.raises(OffloadError, match=r"embeddings, norms and head .* plus its largest block"):
        plan_memory(model, blocks, CPU, "auto", resident + largest - 1)
    with pytest.raises(OffloadError, match="no family adapter recognises"):
        plan_memory(model, torch.nn.ModuleList(), CPU, "always", None)
    with pytest.raises(ValueError, match="offload must be one of"):
        plan_memory(model, blocks, CPU, "sometimes", None)


def test_an_offloaded_model_gives_the_same_logits_and_generation_one_block_at_a_time() -> None:
    model, reference = build("llama", layers=4), build("llama", layers=4)
    ids = calibration()
    streaming = offload(model, match_structure(model).blocks(model), CPU)
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, reference(input_ids=ids).logits)
    assert streaming.peak_on_device == 1 and not streaming.on_device
    prompt = ids[:1, :6]
    cached = model.generate(prompt, max_new_tokens=6, do_sample=False, use_cache=True, pad_token_id=0)
    expected = reference.generate(prompt, max_new_tokens=6, do_sample=False, use_cache=True, pad_token_id=0)
    assert torch.equal(cached, expected)
    assert streaming.peak_on_device == 1


@pytest.mark.parametrize("method", ["wanda", "shortgpt", "slicegpt"])
def test_engines_run_with_the_streaming_suspended_and_it_resumes_on_the_new_blocks(method: str) -> None:
    model, reference = build("llama", layers=4), build("llama", layers=4)
    ids = calibration()
    offload(model, match_structure(model).blocks(model), CPU)
    for each in (model, reference):
        with suspended(each, blocks_after=lambda pruned: match_structure(pruned).blocks(pruned)):
            assert offloaded(each) is None  # no hooks while the engine moves blocks itself
            if method == "slicegpt":
                slice_model(each, ids, None, 0.25, keep_bases=False)
            else:
                prune_model(each, method, 0.25 if method == "shortgpt" else 0.5, calibration_ids=ids)
    streaming = offloaded(model)
    assert streaming is not None and offloaded(reference) is None
    blocks = match_structure(model).blocks(model)
    assert streaming.blocks is blocks  # hooked on the blocks the engine left (ShortGPT: fewer)
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, reference(input_ids=ids).logits, atol=1e-6, rtol=0)
    assert streaming.peak_on_device == 1
