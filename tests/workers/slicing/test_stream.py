"""The calibration stream rewritten in place (workers/slicing/stream.py) and batches cut by sequence."""

from __future__ import annotations

import pytest
import torch

from workers.block_inputs import BlockBatch, split_sequences
from workers.slicing.pca import SecondMoment
from workers.slicing.stream import rewrite_stream

CPU = torch.device("cpu")


def test_split_sequences_cuts_per_sequence_tensors_and_shares_the_rest() -> None:
    hidden = torch.randn(5, 4, 8)
    mask = torch.randn(5, 1, 4, 4)  # per sequence
    tables = torch.randn(1, 4, 2)  # shared by the batch
    positions = torch.arange(5)  # 1-D: never cut, even though its length is the batch size
    pieces = split_sequences(
        hidden, ((tables,), {"mask": mask, "cache_position": positions, "flag": True}), 2
    )

    assert [part.shape[0] for part, _ in pieces] == [2, 2, 1]
    for index, (part, (args, kwargs)) in enumerate(pieces):
        start = 2 * index
        assert torch.equal(part, hidden[start : start + 2])
        assert torch.equal(kwargs["mask"], mask[start : start + 2])
        assert args[0] is tables and kwargs["cache_position"] is positions and kwargs["flag"] is True
    assert split_sequences(hidden, ((), {}), 5)[0][0] is hidden


@pytest.mark.parametrize(("width_in", "width_out"), [(6, 8), (8, 6), (8, 8)])
def test_rewrite_stream_writes_into_the_captured_buffer_and_equals_the_whole_computation(
    width_in: int, width_out: int
) -> None:
    """Widening (walked backwards), narrowing (forwards) and same-width passes, 2 sequences at a time,
    give what the whole batch would, in the buffer the stream was captured in, and their moment."""
    generator = torch.Generator().manual_seed(0)
    captured = torch.randn(5, 3, 8, generator=generator)  # (B, T, D): the buffer
    hidden = captured.view(-1)[: 5 * 3 * width_in].view(5, 3, width_in)
    hidden.copy_(torch.randn(5, 3, width_in, generator=generator))
    keep = torch.rand(5, 3, generator=generator) > 0.3
    weight = torch.randn(width_in, width_out, generator=generator)
    expected = hidden @ weight
    batch = BlockBatch(hidden=hidden, keep=keep, calls=[((), {})])
    moment = SecondMoment(width_out, CPU)

    rewrite_stream(batch, width_out, lambda h, _a, _k: h @ weight, chunk=2, compute=CPU, moment=moment)

    assert batch.hidden.shape == (5, 3, width_out)
    assert batch.hidden.data_ptr() == captured.data_ptr()  # no new buffer
    torch.testing.assert_close(batch.hidden, expected)
    whole = SecondMoment(width_out, CPU)
    whole.add(expected, keep)
    torch.testing.assert_close(moment.matrix, whole.matrix)
    assert moment.positions == whole.positions == int(keep.sum())
