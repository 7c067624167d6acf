"""Snapshot link training learns: on a stream whose next edges join the nodes active now, GCLSTM trained on
next-snapshot links ranks the held-out snapshots' edges far above uniform negatives."""

from __future__ import annotations

import numpy as np
import torch

from distgnn.data.events import EventStream
from distgnn.nn.recurrent import SnapshotModel
from distgnn.snapshot.events import snapshots_from_events
from distgnn.snapshot.schedule import make_plan, make_windows
from distgnn.snapshot.train import SnapshotRunner, evaluate, train_epoch


def active_set_stream(seed: int, nodes: int = 200, active: int = 20, steps: int = 12, per_step: int = 60):
    """Every node appears at time 0 (in a ring); then at each time 1 .. steps - 1, ``per_step`` events between
    random members of one fixed set of ``active`` nodes: the nodes with degree now are the next edges' ends."""
    rng = np.random.default_rng(seed)
    hot = rng.choice(nodes, active, replace=False)
    src, dst, time = [np.arange(nodes)], [np.roll(np.arange(nodes), 1)], [np.zeros(nodes)]
    for t in range(1, steps):
        src.append(rng.choice(hot, per_step))
        dst.append(rng.choice(hot, per_step))
        time.append(np.full(per_step, float(t)))
    return EventStream(np.concatenate(src), np.concatenate(dst), np.concatenate(time), nodes)


def test_link_training_ranks_the_next_edges_above_negatives():
    torch.set_num_threads(1)
    seq = snapshots_from_events(active_set_stream(0), span=1.0)
    samples = len(seq) - 1  # snapshot t predicts t + 1's edges
    num_train = int(0.8 * samples)
    torch.manual_seed(0)
    model = SnapshotModel("gclstm", 2, 8, task="link")
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    runner = SnapshotRunner(model, seq, num_train, torch.device("cpu"), seed=0)
    plan = make_plan("blad", seq.costs()[:num_train], make_windows(num_train, 0), 1)
    untrained = evaluate(runner, 0, num_train, samples)
    losses = []
    for epoch in range(40):
        optimizer.zero_grad()
        losses.append(train_epoch(runner, plan, epoch).loss)
        optimizer.step()
    scores = evaluate(runner, 0, num_train, samples)
    # The bounds sit well below what seeds 0-2 reach (docs/BENCHMARKS.md, "Reliability"); an untrained model
    # starts at the loss of chance, log 2. Its AUC depends on the initial weights (far below chance here, above
    # the bound for some seeds), so the gain over the same model before training is asserted too.
    assert losses[0] > 0.65 and losses[-1] < 0.55, losses
    assert scores["auc"] > 0.85 and scores["mrr"] > 0.5, scores
    assert scores["auc"] > untrained["auc"] + 0.5 and scores["mrr"] > untrained["mrr"] + 0.3, (untrained, scores)
