"""DistNodeDataLoader on a 2-machine LocalCluster: equal batch counts, every seed once per epoch,
workers give the same batches as inline sampling, and leave nothing behind."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from netns_cluster import free_port

from distgnn.data import synthetic
from distgnn.loader.node import DistNodeDataLoader
from distgnn.sampling.neighbor import NeighborSampler

BATCH = 16


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from distgnn.partition import partition_graph
    from distgnn.train.cluster import LocalCluster

    graph = synthetic(2000, 6, feat_dim=4, num_classes=3, seed=1)
    json_path = partition_graph(graph, 2, tmp_path_factory.mktemp("parts") / "g", graph_name="g", method="random")
    with LocalCluster(json_path, rpc_timeout_s=30) as c:
        yield c, json_path


def open_graph(cluster, json_path, machine: int, world_size: int = 2, rank: int | None = None):
    from distgnn.client.context import connect
    from distgnn.client.graph import DistGraph

    rank = machine if rank is None else rank
    return DistGraph("g", json_path, context=connect(cluster.config(machine), rank=rank, world_size=world_size))


def _trainer(rank: int, config, json_path, port: int, seeds: np.ndarray, num_workers: int, drop_last: bool, out):
    import torch.distributed as dist

    from distgnn.client.context import connect
    from distgnn.client.graph import DistGraph

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    g = DistGraph("g", json_path, context=connect(config, rank=rank, world_size=2))
    try:
        loader = DistNodeDataLoader(
            g, seeds, NeighborSampler([3, 2]), BATCH, shuffle=True, drop_last=drop_last, num_workers=num_workers
        )
        with loader:
            epochs = [[output_nodes.numpy() for _, output_nodes, _ in loader] for _ in range(2)]
        out.put((rank, len(loader), epochs))
    finally:
        g.context.close()
        dist.destroy_process_group()


def run_two_trainers(cluster, json_path, seeds_per_rank, num_workers, drop_last):
    port = free_port()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(
            target=_trainer,
            args=(r, cluster.config(r), json_path, port, seeds_per_rank[r], num_workers[r], drop_last, out),
        )
        for r in range(2)
    ]
    for p in procs:
        p.start()
    results = dict((lambda r: (r[0], r[1:]))(out.get(timeout=240)) for _ in procs)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    return results


@pytest.mark.slow
def test_trainers_get_equal_batch_counts_and_see_every_seed_once(cluster) -> None:
    c, json_path = cluster
    rng = np.random.default_rng(0)
    pool = rng.permutation(2000)
    seeds = [pool[:100], pool[100:137]]  # uneven on purpose: 7 vs 3 batches of 16 on their own
    results = run_two_trainers(c, json_path, seeds, num_workers=[1, 0], drop_last=False)
    (len0, epochs0), (len1, epochs1) = results[0], results[1]
    assert len0 == len1 == 7
    for rank, epochs in ((0, epochs0), (1, epochs1)):
        for batches in epochs:
            assert len(batches) == 7
            assert all(0 < len(b) <= BATCH for b in batches)
            got = np.concatenate(batches)
            assert len(got) == len(seeds[rank])
            np.testing.assert_array_equal(np.sort(got), np.sort(seeds[rank]))
        # Shuffled differently in each epoch.
        assert not np.array_equal(np.concatenate(epochs[0]), np.concatenate(epochs[1]))


@pytest.mark.slow
def test_drop_last_agrees_on_the_smallest_count_of_full_batches(cluster) -> None:
    c, json_path = cluster
    seeds = [np.arange(0, 100), np.arange(100, 137)]
    results = run_two_trainers(c, json_path, seeds, num_workers=[0, 0], drop_last=True)
    for rank in (0, 1):
        length, epochs = results[rank]
        assert length == 2  # 37 // 16
        for batches in epochs:
            assert [len(b) for b in batches] == [BATCH, BATCH]
            assert len(np.unique(np.concatenate(batches))) == 2 * BATCH


def test_workers_yield_the_same_batches_as_inline_sampling_and_stop_cleanly(cluster) -> None:
    c, json_path = cluster
    g = open_graph(c, json_path, 0, world_size=1)
    try:
        seeds = torch.arange(0, 2000, 13)
        sampler = NeighborSampler([3, 2])

        def epochs(loader, cut_first_epoch: bool):
            out = []
            for epoch in range(2):
                batches = []
                for i, (input_nodes, output_nodes, blocks) in enumerate(loader):
                    batches.append((input_nodes, output_nodes, [b.eids for b in blocks]))
                    if cut_first_epoch and epoch == 0 and i == 1:
                        break  # leave the epoch early: the next one must still be complete and in order
                out.append(batches)
            return out

        inline = DistNodeDataLoader(g, seeds, sampler, BATCH, shuffle=True, num_workers=0, prefetch=0, seed=4)
        want = epochs(inline, cut_first_epoch=True)
        for num_workers, prefetch in ((2, 1), (0, 2)):  # two processes; one background thread
            loader = DistNodeDataLoader(
                g, seeds, sampler, BATCH, shuffle=True, num_workers=num_workers, prefetch=prefetch, seed=4
            )
            procs = list(loader._workers.procs)
            got = epochs(loader, cut_first_epoch=True)
            loader.close()
            assert all(not p.is_alive() for p in procs)
            assert [len(e) for e in got] == [len(e) for e in want] == [2, len(loader)]
            for epoch_got, epoch_want in zip(got, want, strict=True):
                for (i_got, o_got, e_got), (i_want, o_want, e_want) in zip(epoch_got, epoch_want, strict=True):
                    torch.testing.assert_close(o_got, o_want)
                    torch.testing.assert_close(i_got, i_want)
                    for a, b in zip(e_got, e_want, strict=True):
                        torch.testing.assert_close(a, b)
    finally:
        g.context.close()


def test_a_failing_worker_raises_in_the_trainer_and_is_gone(cluster) -> None:
    from distgnn.errors import DistGNNError

    c, json_path = cluster
    g = open_graph(c, json_path, 1, world_size=1, rank=0)
    try:
        sampler = NeighborSampler([2], prob="no-such-weight")
        loader = DistNodeDataLoader(g, torch.arange(100), sampler, BATCH, num_workers=1)
        procs = list(loader._workers.procs)
        with pytest.raises(DistGNNError, match="no-such-weight"):
            list(loader)
        loader.close()
        assert all(not p.is_alive() for p in procs)
    finally:
        g.context.close()


@pytest.mark.parametrize("num_workers", [0, 1])
def test_prefetched_node_data_matches_the_dist_tensors(cluster, num_workers: int) -> None:
    c, json_path = cluster
    g = open_graph(c, json_path, 0, world_size=1)
    try:
        loader = DistNodeDataLoader(
            g,
            torch.arange(0, 2000, 5),
            NeighborSampler([3, 2]),
            BATCH,
            num_workers=num_workers,
            input_feats=["feat"],
            output_feats=["label"],
        )
        with loader:
            for count, batch in enumerate(loader):
                input_nodes, output_nodes, _ = batch
                torch.testing.assert_close(batch.input_data["feat"], g.ndata["feat"][input_nodes])
                torch.testing.assert_close(batch.output_data["label"], g.ndata["label"][output_nodes])
                assert batch.timing["sample"] >= 0 and batch.timing["fetch"] >= 0
                if count == 3:
                    break
        with pytest.raises(Exception, match="no node data"):
            DistNodeDataLoader(g, torch.arange(10), NeighborSampler([2]), BATCH, input_feats=["nope"])
    finally:
        g.context.close()


EXIT_MID_EPOCH = """
import sys, time, torch
from distgnn.data import synthetic
from distgnn.loader.node import DistNodeDataLoader
from distgnn.sampling.source import InProcessGraph
from distgnn.sampling.neighbor import NeighborSampler

slow = torch.randn(700, 700)
original = NeighborSampler.sample_blocks
calls = []

def slow_sample_blocks(self, g, seeds, *args, **kwargs):
    calls.append(1)
    end = time.monotonic() + (6.0 if len(calls) > 1 else 0.0)
    while time.monotonic() < end:  # GIL-free torch work for longer than the loader's 5 s stop deadline
        slow @ slow
    return original(self, g, seeds, *args, **kwargs)

NeighborSampler.sample_blocks = slow_sample_blocks
torch.set_num_threads(1)
g = InProcessGraph(synthetic(2000, 6, feat_dim=4, num_classes=3, seed=1))
loader = DistNodeDataLoader(g, torch.arange(2000), NeighborSampler([3]), 16, num_workers=0, prefetch=2)
batches = iter(loader)
next(batches)
print("left mid-epoch", flush=True)
"""


def test_leaving_mid_epoch_without_close_exits_cleanly_with_the_prefetch_thread_busy() -> None:
    # The script returns while the prefetch thread is inside torch work and never closes the loader;
    # the process must end on its own, quickly and with status 0 (no abort from the thread at exit).
    import subprocess
    import sys
    import time

    proc = subprocess.Popen(
        [sys.executable, "-c", EXIT_MID_EPOCH], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        line = proc.stdout.readline()  # the script's last line, printed as it returns
        left = time.monotonic()
        _, err = proc.communicate(timeout=120)
        # Timed from the script's return, not its start: torch's import under load is not what is tested.
        exited_after = time.monotonic() - left
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-2000:]
    assert "left mid-epoch" in line
    assert "terminate called" not in err
    assert exited_after < 30, f"{exited_after:.1f} s from leaving mid-epoch to the process's exit"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("prefetch", [0, 2])
def test_gpu_sampling_runs_on_its_own_stream_and_hands_over_finished_batches(prefetch: int) -> None:
    from distgnn.sampling.source import InProcessGraph

    g = InProcessGraph(synthetic(3000, 8, feat_dim=4, num_classes=3, seed=2))
    sampler = NeighborSampler([5, 3], device="cuda")
    default_switches = sys.getswitchinterval()
    loader = DistNodeDataLoader(g, torch.arange(3000), sampler, 256, shuffle=True, seed=4, prefetch=prefetch)
    assert loader._stream is not None and loader._stream != torch.cuda.current_stream()
    # The GPU sampler's prefetch thread holds the switch interval short while it runs.
    assert (sys.getswitchinterval() < default_switches) == (prefetch > 0)
    try:
        for index, batch in enumerate(loader):
            # Queue a long kernel first: a batch handed over unfinished would be read before it was written.
            torch.cuda._sleep(2_000_000)
            seeds = loader.plan.batches(0)[index]
            want = sampler.sample_blocks(g, seeds, loader.plan.batch_rng_seed(0, index))
            assert torch.equal(batch[0], want[0]) and torch.equal(batch[1], want[1])
            for got_block, want_block in zip(batch[2], want[2], strict=True):
                assert got_block.num_dst == want_block.num_dst
                for name in ("src_nids", "indptr", "indices", "eids"):
                    assert torch.equal(getattr(got_block, name), getattr(want_block, name)), name
    finally:
        loader.close()
        sampler.close()
    assert sys.getswitchinterval() == default_switches
    cpu_loader = DistNodeDataLoader(g, torch.arange(3000), NeighborSampler([5, 3]), 256)
    assert cpu_loader._stream is None


def test_short_switches_hold_while_any_holder_runs_and_a_cpu_prefetch_thread_keeps_the_default() -> None:
    # A GPU sampler's prefetch thread holds the switch interval short (the trainer's thread waits for the GIL
    # behind it at most one short interval); the interval found is back once the last holder let go. A CPU
    # sampler's thread leaves it as it is.
    from distgnn.loader._workers import PREFETCH_SWITCH_INTERVAL_S, _short_switches
    from distgnn.sampling.source import InProcessGraph

    before = sys.getswitchinterval()
    assert before > PREFETCH_SWITCH_INTERVAL_S  # the interpreter's default
    _short_switches.acquire()
    _short_switches.acquire()
    try:
        assert sys.getswitchinterval() == pytest.approx(PREFETCH_SWITCH_INTERVAL_S)
        _short_switches.release()
        assert sys.getswitchinterval() == pytest.approx(PREFETCH_SWITCH_INTERVAL_S)  # the other still holds it
    finally:
        _short_switches.release()
    assert sys.getswitchinterval() == before
    g = InProcessGraph(synthetic(300, 4, feat_dim=2, num_classes=2, seed=3))
    loader = DistNodeDataLoader(g, torch.arange(300), NeighborSampler([2]), 64, prefetch=1)
    try:
        assert loader._workers is not None and sys.getswitchinterval() == before
        assert sum(len(batch[1]) for batch in loader) == 300
    finally:
        loader.close()
    assert sys.getswitchinterval() == before
