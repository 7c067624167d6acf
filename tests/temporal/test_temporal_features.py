"""Event attributes in the TGN: the message a batch leaves carries its events' features (eager and dense step),
and the default model learns a real stream whose attribute is a rating (Bitcoin OTC)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from distgnn.data.events import read_events, synthetic_events
from distgnn.nn.temporal import TGN
from distgnn.temporal import build_temporal_csr
from distgnn.temporal.step import DenseStep
from distgnn.temporal.train import TGNRunner, batch_ranges, chronological_split, train_epoch

BITCOIN_OTC = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "snap" / "soc-sign-bitcoinotc.csv"


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def last_event_of(events, stop: int) -> dict[int, int]:
    """Each node's last event among the first ``stop`` (a destination after the source of the same event)."""
    last = {}
    for event in range(stop):
        last[int(events.src[event])] = event
        last[int(events.dst[event])] = event
    return last


@pytest.mark.parametrize("step", ["eager", "dense"])
def test_mail_carries_each_nodes_last_event_features(one_thread, step):
    events = synthetic_events(30, 200, seed=1, feat_dim=3)
    torch.manual_seed(0)
    model = TGN(events.num_nodes, events.feat_dim, memory_dim=8, time_dim=4, embedding_dim=8)
    runner = TGNRunner(model, events, build_temporal_csr(events), torch.device("cpu"), k=4, seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if step == "dense":
        dense = DenseStep(runner, optimizer, 50)
        for begin in (0, 50):
            dense(begin, runner.draw_negatives(50, 1))
    else:
        for begin, end in batch_ranges(0, 100, 50):
            runner.train_batch(begin, end, optimizer)
    memory, width = runner.memory, 2 * model.memory_dim
    # The message stays in the mailbox after a later read applied it (the mailbox flag alone is cleared).
    for node, event in last_event_of(events, 100).items():
        np.testing.assert_array_equal(memory.mail[node, width:].numpy(), events.feat[event])
        assert memory.mail_time[node] == events.time[event]


def test_default_model_learns_bitcoin_otc_in_one_epoch(one_thread):
    """The default TGN (PyG's example's sizes) on Bitcoin OTC, its rating an event feature: one epoch lifts
    validation AP well above chance (0.5)."""
    if not BITCOIN_OTC.is_file():
        pytest.skip(f"Bitcoin OTC not found at {BITCOIN_OTC} (shared data absent)")
    events = read_events(BITCOIN_OTC, columns=("src", "dst", "rating", "time"))
    torch.manual_seed(0)
    model = TGN(events.num_nodes, events.feat_dim)
    runner = TGNRunner(model, events, build_temporal_csr(events), torch.device("cpu"), k=10, seed=0, num_threads=1)
    train_end, val_end = chronological_split(len(events))
    train_epoch(runner, batch_ranges(0, train_end, 200), torch.optim.Adam(model.parameters(), lr=1e-4))
    assert runner.evaluate(batch_ranges(train_end, val_end, 200))["ap"] > 0.75
