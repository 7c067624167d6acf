"""The stream replay (:class:`~distgnn.temporal.warm.StreamReplay`: indices found once on the host, no host sync
per chunk, captured in a CUDA graph on a GPU) against the chunk-by-chunk replay
(:func:`~distgnn.temporal.warm.replay_memory`) into an emptied memory: the same memory and mailbox."""

from __future__ import annotations

import pytest
import torch

from distgnn.data.events import EventStream, synthetic_events
from distgnn.errors import ConfigError
from distgnn.nn.temporal import TGN, NodeMemory
from distgnn.temporal.train import batch_ranges
from distgnn.temporal.warm import StreamReplay, replay_memory


def with_self_loops(events: EventStream) -> EventStream:
    """``events`` with every seventh event's destination set to its source (a node twice in one event)."""
    dst = events.dst.copy()
    dst[::7] = events.src[::7]
    return EventStream(events.src, dst, events.time, events.num_nodes, feat=events.feat)


def tensors(events: EventStream, device: str) -> tuple:
    feat = None if events.feat is None else torch.from_numpy(events.feat).to(device)
    return (*(torch.from_numpy(a).to(device) for a in (events.src, events.dst, events.time)), feat)


def reference(model: TGN, events: EventStream, stop: int, batch_size: int, device: str) -> NodeMemory:
    memory = model.new_memory(device)
    replay_memory(model, memory, *tensors(events, device), batch_ranges(0, stop, batch_size))
    return memory


def assert_same_memory(a: NodeMemory, b: NodeMemory) -> None:
    for name in NodeMemory.FIELDS:
        torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize(("feat_dim", "learn_time"), [(0, False), (3, True)])
def test_stream_replay_equals_the_chunk_by_chunk_replay(feat_dim, learn_time):
    """From a memory that is not empty (the replay empties it), a stop that is not a multiple of the chunk, and
    events whose source is their destination: every field as the chunk-by-chunk replay leaves an emptied memory,
    again after the weights change."""
    events = with_self_loops(synthetic_events(40, 900, seed=3, feat_dim=feat_dim))
    torch.manual_seed(0)
    model = TGN(events.num_nodes, feat_dim, memory_dim=12, time_dim=6, embedding_dim=8, learn_time=learn_time)
    replay = StreamReplay(*tensors(events, "cpu"), 650, 60, torch.device("cpu"))
    memory = model.new_memory()
    for name in NodeMemory.FIELDS:
        getattr(memory, name).fill_(1)
    replay.replay(model, memory)
    assert_same_memory(memory, reference(model, events, 650, 60, "cpu"))
    assert bool(memory.has_mail.any()) and float(memory.memory.abs().sum()) > 0
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.1 * torch.randn_like(param))
    replay.replay(model, memory)
    assert_same_memory(memory, reference(model, events, 650, 60, "cpu"))


def test_stream_replay_refuses_an_empty_or_too_long_range():
    events = synthetic_events(20, 100, seed=1)
    for stop, batch_size in [(0, 10), (101, 10), (50, 0)]:
        with pytest.raises(ConfigError, match="a replay covers events"):
            StreamReplay(*tensors(events, "cpu"), stop, batch_size, torch.device("cpu"))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_stream_replay_captured_on_a_gpu_equals_the_chunk_by_chunk_replay():
    """On a GPU: the eager first call (captured right after it), the replays after the weights change and a call
    with another memory (eager and captured again) each leave the chunk-by-chunk replay's memory."""
    device = "cuda"
    events = with_self_loops(synthetic_events(60, 3000, seed=4, feat_dim=2))
    torch.manual_seed(0)
    model = TGN(events.num_nodes, 2, memory_dim=16, time_dim=8, embedding_dim=8).to(device)
    replay = StreamReplay(*tensors(events, device), 2500, 200, torch.device(device))
    memory = model.new_memory(device)
    for _ in range(3):
        replay.replay(model, memory)
        assert_same_memory(memory, reference(model, events, 2500, 200, device))
        assert replay._graph is not None and replay._memory is memory
        with torch.no_grad():
            for param in model.parameters():
                param.add_(0.1 * torch.randn_like(param))
    other = model.new_memory(device)
    replay.replay(model, other)
    assert replay._graph is not None and replay._memory is other
    assert_same_memory(other, reference(model, events, 2500, 200, device))
