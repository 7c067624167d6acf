"""A loader's position: sampler workers started mid-epoch make exactly the remaining batches, each the one
the reader expects from it."""

from __future__ import annotations

import queue
import threading

import numpy as np
import pytest

from distgnn.loader._workers import sample_loop
from distgnn.loader.base import BatchPlan


def _made_by_worker(plan: BatchPlan, worker: int, num_workers: int, epoch: int, start: int) -> list[int]:
    commands, out = queue.Queue(), queue.Queue()
    commands.put((epoch, start))

    def maker(g, sampler, seeds, rng_seed):
        return rng_seed

    args = (None, None, worker, num_workers, maker, plan, commands, out, lambda: True)
    thread = threading.Thread(target=sample_loop, args=args)
    thread.start()
    items = [out.get(timeout=10)]
    while items[-1][0] != "end":
        items.append(out.get(timeout=10))
    commands.put(None)
    thread.join(10)
    assert items[-1] == ("end", epoch)
    for kind, got_epoch, index, rng_seed in items[:-1]:
        assert (kind, got_epoch, rng_seed) == ("batch", epoch, plan.batch_rng_seed(epoch, index))
    return [index for _, _, index, _ in items[:-1]]


@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_workers_started_mid_epoch_make_the_remaining_batches_round_robin(num_workers):
    plan = BatchPlan(np.arange(70), num_batches=7, batch_size=10, shuffle=True, drop_last=False, seed=5)
    for start in range(8):
        made = {w: _made_by_worker(plan, w, num_workers, 2, start) for w in range(num_workers)}
        # The reader takes batch i from worker i % num_workers, in order.
        for w, indices in made.items():
            assert indices == [i for i in range(start, 7) if i % num_workers == w]


def test_a_loader_resumed_from_its_state_yields_the_same_remaining_batches():
    from distgnn.data import synthetic
    from distgnn.errors import ConfigError
    from distgnn.loader.node import DistNodeDataLoader
    from distgnn.sampling.neighbor import NeighborSampler
    from distgnn.sampling.source import InProcessGraph

    g = InProcessGraph(synthetic(500, 4, feat_dim=2, num_classes=2, seed=0))

    def loader(batch_size=20):
        return DistNodeDataLoader(g, np.arange(100), NeighborSampler([2]), batch_size, shuffle=True, seed=1)

    first = loader()
    uninterrupted = [seeds.tolist() for _ in range(2) for _, seeds, _ in first]
    second = loader()
    it = iter(second)
    taken = [next(it)[1].tolist() for _ in range(3)]
    state = second.state_dict()
    assert (state["epoch"], state["batch"]) == (0, 3)
    resumed = loader()
    resumed.load_state_dict(state)
    rest = [seeds.tolist() for _, seeds, _ in resumed] + [seeds.tolist() for _, seeds, _ in resumed]
    assert taken + rest == uninterrupted
    assert resumed.state_dict()["epoch"] == 2 and resumed.state_dict()["batch"] == 0
    with pytest.raises(ConfigError, match="batches per epoch"):
        loader(batch_size=10).load_state_dict(state)
