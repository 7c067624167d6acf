"""NeighborSampler with a device: the torch merge/relabel path and the GPU sampling of the local partition.

On the CPU (``device="cpu"``) the local picks come from the same C++ kernel and random streams as the
numpy path (``device=None``), so the blocks must be equal, on one partition and on a 2-machine
LocalCluster with remote seeds. The torch relabel and merge are compared with the numpy/C++ versions on
random inputs. The CUDA tests (skipped without a GPU) check validity on the GPU for both graph memories.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from distgnn.data import synthetic
from distgnn.data.graph import Graph
from distgnn.errors import ConfigError, InputError
from distgnn.loader.node import DistNodeDataLoader
from distgnn.sampling import cpu, reference
from distgnn.sampling import gpu as on_device
from distgnn.sampling.cpu import merge, sample_local
from distgnn.sampling.neighbor import NeighborSampler
from distgnn.sampling.source import InProcessGraph, LocalCSC, SampleRequest

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")


def assert_blocks_equal(got, want) -> None:
    """Two ``sample_blocks`` results hold equal ids and blocks (``got`` may be on another device)."""
    assert len(got[2]) == len(want[2])
    torch.testing.assert_close(got[0].cpu(), want[0], rtol=0, atol=0)
    torch.testing.assert_close(got[1].cpu(), want[1], rtol=0, atol=0)
    for a, b in zip(got[2], want[2], strict=True):
        assert a.num_dst == b.num_dst
        for field in ("src_nids", "indptr", "indices", "eids"):
            x, y = getattr(a, field), getattr(b, field)
            assert x.dtype == y.dtype == torch.int64, field
            assert torch.equal(x.cpu(), y), field


def check_valid(graph: Graph, seeds: np.ndarray, fanouts: list[int], result, replace: bool = False) -> None:
    """Blocks of an InProcessGraph (ids are the graph's own): real edges, counts, dst first, unique sources."""
    input_nodes, output_nodes, blocks = result
    in_degree = np.bincount(graph.dst, minlength=graph.num_nodes)
    np.testing.assert_array_equal(output_nodes.cpu().numpy(), seeds)
    np.testing.assert_array_equal(input_nodes.cpu().numpy(), blocks[0].src_nids.cpu().numpy())
    dst = seeds
    for layer in reversed(range(len(blocks))):
        block, fanout = blocks[layer], fanouts[layer]
        src_nids = block.src_nids.cpu().numpy()
        indices, eids = block.indices.cpu().numpy(), block.eids.cpu().numpy()
        counts = np.diff(block.indptr.cpu().numpy())
        assert block.num_dst == len(dst)
        np.testing.assert_array_equal(src_nids[: block.num_dst], dst)
        assert len(np.unique(src_nids)) == len(src_nids)
        degree = in_degree[dst]
        if fanout == -1:
            np.testing.assert_array_equal(counts, degree)
        elif replace:
            np.testing.assert_array_equal(counts, np.where(degree > 0, fanout, 0))
        else:
            np.testing.assert_array_equal(counts, np.minimum(degree, fanout))
        np.testing.assert_array_equal(graph.src[eids], src_nids[indices])
        np.testing.assert_array_equal(graph.dst[eids], np.repeat(dst, counts))
        if not replace:
            assert len(np.unique(eids)) == len(eids)
        # Every source beyond the destinations is the endpoint of a sampled edge.
        assert np.all(np.isin(src_nids[block.num_dst :], src_nids[indices]))
        dst = src_nids


def check_picks_among(block, every, fanout: int) -> None:
    """``block`` (fanout ``fanout``, no replacement) picks among the edges of ``every`` (fanout -1, same dst)."""

    def edges(b):
        ends = torch.stack([b.src_nids[b.indices], b.dst_nids[b.dst_index()]], 1)
        return zip(b.eids.tolist(), map(tuple, ends.tolist()), strict=True)

    assert torch.equal(block.dst_nids, every.dst_nids)
    np.testing.assert_array_equal(np.diff(block.indptr.numpy()), np.minimum(np.diff(every.indptr.numpy()), fanout))
    edge = dict(edges(every))
    picked = list(edges(block))
    assert all(edge[e] == ends for e, ends in picked)
    assert len({e for e, _ in picked}) == len(picked)


@pytest.fixture(scope="module")
def small_graph() -> Graph:
    return synthetic(3000, 8, feat_dim=4, num_classes=4, seed=3)


def halo_csc(rng: np.random.Generator, contiguous_eids: bool) -> LocalCSC:
    """A partition-like LocalCSC: owned nodes [500, 900), HALO nodes after them, some nodes without edges."""
    num_owned, num_halo, node_start = 400, 150, 500
    degrees = rng.integers(0, 12, num_owned)
    degrees[rng.random(num_owned) < 0.2] = 0
    indptr = np.zeros(num_owned + 1, dtype=np.int64)
    np.cumsum(degrees, out=indptr[1:])
    num_edges = int(indptr[-1])
    halo = rng.choice(np.setdiff1d(np.arange(5000), np.arange(node_start, node_start + num_owned)), num_halo, False)
    edge_start = 7000
    eids = np.arange(edge_start, edge_start + num_edges, dtype=np.int64)
    return LocalCSC(
        part_id=1,
        node_start=node_start,
        indptr=indptr,
        indices=rng.integers(0, num_owned + num_halo, num_edges).astype(np.int32),
        eids=eids if contiguous_eids else rng.permutation(eids),
        local2global=np.concatenate([np.arange(node_start, node_start + num_owned), halo]).astype(np.int64),
        edge_weights={},
    )


# ---- CPU: the torch path equals the numpy path ----


@pytest.mark.parametrize(("fanouts", "replace"), [([5, 3], False), ([4, -1, 2], False), ([3, 3], True)])
def test_cpu_device_blocks_equal_the_numpy_path(small_graph: Graph, fanouts, replace) -> None:
    g = InProcessGraph(small_graph)
    seeds = np.random.default_rng(1).choice(small_graph.num_nodes, 200, replace=False)
    want = NeighborSampler(fanouts, replace).sample_blocks(g, seeds, rng_seed=7)
    got = NeighborSampler(fanouts, replace, device="cpu").sample_blocks(g, torch.from_numpy(seeds), rng_seed=7)
    assert_blocks_equal(got, want)
    check_valid(small_graph, seeds, fanouts, got, replace)


def test_cpu_device_with_empty_seeds_gives_empty_blocks(small_graph: Graph) -> None:
    g = InProcessGraph(small_graph)
    seeds = np.zeros(0, dtype=np.int64)
    want = NeighborSampler([3, 2]).sample_blocks(g, seeds)
    got = NeighborSampler([3, 2], device="cpu").sample_blocks(g, seeds)
    assert_blocks_equal(got, want)
    assert all(b.num_edges == 0 and b.num_src == 0 for b in got[2])


def test_device_path_rejects_repeated_and_out_of_range_seeds(small_graph: Graph) -> None:
    g = InProcessGraph(small_graph)
    sampler = NeighborSampler([2], device="cpu")
    with pytest.raises(InputError, match="unique"):
        sampler.sample_blocks(g, np.array([1, 2, 1]))
    with pytest.raises(InputError, match="out of range"):
        sampler.sample_blocks(g, np.array([1, small_graph.num_nodes]))


def random_layer(trial: int, scale: int = 1) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(100 + trial)
    num_dst = [0, 1, 40, 300, 3000][trial] * scale
    pool = rng.choice(100_000 * scale, 6000 * scale, replace=False)
    dst = rng.permutation(pool)[:num_dst].astype(np.int64)
    counts = rng.integers(0, 6, num_dst).astype(np.int64)
    counts[rng.random(num_dst) < 0.3] = 0  # dst nodes without edges; trial 1 may have no edges at all
    # Sources drawn from a small pool: many repeats, and many of them are dst nodes too.
    src = rng.choice(pool[: 2000 * scale], int(counts.sum())).astype(np.int64)
    eids = rng.integers(0, 50_000, len(src)).astype(np.int64)
    return dst, counts, src, eids


@pytest.mark.parametrize("relabel", ["torch", "kernel"])
@pytest.mark.parametrize("trial", range(5))
def test_relabel_matches_the_kernel_on_random_layers(trial: int, relabel: str) -> None:
    dst, counts, src, eids = random_layer(trial)
    got = on_device.to_block(*(torch.from_numpy(a) for a in (dst, counts, src, eids)), validate=False, impl=relabel)
    for want in (cpu.to_block(dst, counts, src, eids), reference.to_block(dst, counts, src, eids)):
        assert got.num_dst == want.num_dst == len(dst)
        for field in ("src_nids", "indptr", "indices", "eids"):
            assert torch.equal(getattr(got, field), getattr(want, field)), field


@needs_cuda
@pytest.mark.parametrize("scale", [1, 40])
@pytest.mark.parametrize("trial", range(5))
def test_cuda_relabel_kernel_matches_the_torch_relabel(trial: int, scale: int) -> None:
    dst, counts, src, eids = (torch.from_numpy(a).cuda() for a in random_layer(trial, scale))
    got = on_device.to_block(dst, counts, src, eids, validate=False, impl="kernel")
    want = on_device.to_block(dst, counts, src, eids, validate=False, impl="torch")
    assert got.num_dst == want.num_dst
    for field in ("src_nids", "indptr", "indices", "eids"):
        assert torch.equal(getattr(got, field), getattr(want, field)), field


@needs_cuda
@pytest.mark.parametrize("num_dst", [1, 690])
def test_cuda_relabel_fills_its_table_to_two_thirds(num_dst: int) -> None:
    """Every position a different id, as many as the table takes at most (43,690 positions in 65,536 slots): the
    kernel still agrees with the torch relabel."""
    rng = np.random.default_rng(num_dst)
    ids = rng.choice(10**12, 43_690, replace=False)
    dst, src = ids[:num_dst], ids[num_dst:]
    counts = rng.multinomial(len(src), [1 / num_dst] * num_dst)
    eids = np.arange(len(src), dtype=np.int64)
    args = [torch.from_numpy(np.asarray(a, dtype=np.int64)).cuda() for a in (dst, counts, src, eids)]
    got = on_device.to_block(*args, validate=False, impl="kernel")
    want = on_device.to_block(*args, validate=False, impl="torch")
    assert got.src_nids.numel() == 43_690
    for field in ("src_nids", "indptr", "indices", "eids"):
        assert torch.equal(getattr(got, field), getattr(want, field)), field


def test_one_call_layers_are_those_the_local_csc_samples_alone() -> None:
    """A layer takes the one-sync call only where the local CSC owns every seed (replicated, or the one partition)
    and the fanout bounds its size; everything else keeps the owner split and the per-step path."""
    local = halo_csc(np.random.default_rng(1), True)  # partition 1
    frontier = torch.arange(1000)
    only, two = torch.tensor([5000]), torch.tensor([500, 5000])
    assert not on_device._samples_all_here(local, only, 5, frontier)  # the one partition is not this one
    assert not on_device._samples_all_here(local, two, 5, frontier)
    first = dataclasses.replace(local, part_id=0)
    assert on_device._samples_all_here(first, only, 5, frontier)
    assert not on_device._samples_all_here(first, only, -1, frontier)  # all neighbours: no bound
    replicated = dataclasses.replace(local, replicated=True)
    assert on_device._samples_all_here(replicated, two, 5, frontier)
    assert not on_device._samples_all_here(replicated, two, on_device.MAX_BOUND_PICKS // 1000 + 1, frontier)


def test_a_batch_takes_one_call_only_within_every_layers_bound() -> None:
    """Layer l + 1's seeds are at most layer l's times (1 + fanout): a batch is one call while every layer's
    picks stay within the bound and the layers within the binding's count."""
    bound = on_device.MAX_BOUND_PICKS
    assert on_device.bounded_batch(1024, [15, 10, 5])
    assert on_device.bounded_batch(0, [3, 3])
    assert not on_device.bounded_batch(1024, [15, -1])  # all neighbours: no bound
    assert on_device.bounded_batch(1, [bound - 1, 1])  # 1 x (bound - 1) picks, then bound seeds x 1
    assert not on_device.bounded_batch(1, [bound - 1, 2])  # the second layer's picks pass the bound
    assert not on_device.bounded_batch(2, [1] * (on_device.MAX_BATCH_LAYERS + 1))
    assert on_device.bounded_batch(2, [1] * on_device.MAX_BATCH_LAYERS)


def test_gpu_relabel_names_bad_inputs() -> None:
    from distgnn.sampling import gpu

    with pytest.raises(ValueError, match="int64"):
        gpu.relabel(torch.tensor([1], dtype=torch.int32), torch.tensor([2]))
    with pytest.raises(ValueError, match="impl must be one of"):
        on_device.to_block(
            torch.tensor([1]),
            torch.tensor([0]),
            torch.zeros(0, dtype=torch.int64),
            torch.zeros(0, dtype=torch.int64),
            impl="sort",
        )


def test_relabel_rejects_bad_inputs() -> None:
    def relabel(dst, counts, src, eids=None):
        as_t = lambda a: torch.as_tensor(a, dtype=torch.int64)  # noqa: E731
        return on_device.to_block(as_t(dst), as_t(counts), as_t(src), as_t(src if eids is None else eids))

    with pytest.raises(ValueError, match="unique"):
        relabel([3, 4, 3], [1, 0, 0], [9])
    with pytest.raises(ValueError, match="sum to the number of edges"):
        relabel([3, 4], [1, 1], [9])
    with pytest.raises(ValueError, match="non-negative"):
        relabel([3, 4], [2, -1], [9])
    with pytest.raises(ValueError, match="one entry per dst"):
        relabel([3, 4], [1], [9])
    with pytest.raises(ValueError, match="equal length"):
        relabel([3], [1], [9], eids=[1, 2])
    with pytest.raises(ValueError, match="int64"):
        on_device.to_block(torch.tensor([1.0]), torch.tensor([0]), torch.zeros(0, dtype=torch.int64), torch.tensor([]))


def test_merge_matches_the_numpy_merge_on_random_owners() -> None:
    rng = np.random.default_rng(0)
    num_seeds = 80
    owner = rng.integers(0, 3, num_seeds)
    owner[:5] = 2  # every owner present
    counts = rng.integers(0, 5, num_seeds)
    wheres, results = [], []
    for part in range(3):
        where = np.flatnonzero(owner == part)
        n = int(counts[where].sum())
        results.append((counts[where], rng.integers(0, 1000, n), rng.integers(0, 1000, n)))
        wheres.append(where)
    want = merge(num_seeds, wheres, results)
    got = on_device.merge(
        num_seeds,
        [torch.from_numpy(w) for w in wheres],
        [tuple(torch.from_numpy(a) for a in r) for r in results],
        torch.device("cpu"),
    )
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a.numpy(), b)
    one = tuple(torch.from_numpy(a) for a in results[0])
    assert on_device.merge(len(wheres[0]), [None], [one], torch.device("cpu")) is one


@pytest.mark.skipif(CUDA, reason="checks the CPU fallback of the GPU kernel (runs the C++ kernel without CUDA)")
@pytest.mark.parametrize("contiguous_eids", [True, False])
def test_device_csc_sample_through_the_gpu_entry_point_equals_the_numpy_path(contiguous_eids: bool) -> None:
    """DeviceCSC.sample (global ids via local2global, eids by range or lookup) on the kernel's CPU fallback."""
    local = halo_csc(np.random.default_rng(5), contiguous_eids)
    csc = on_device.DeviceCSC(local, torch.device("cpu"))
    assert (csc.eids is None) == contiguous_eids
    seeds = np.random.default_rng(6).choice(np.arange(500, 900), 150, replace=False)
    for fanout, replace in ((4, False), (-1, False), (3, True)):
        want = sample_local(local, SampleRequest(seeds, fanout, replace, None, 99))
        got = csc.sample(torch.from_numpy(seeds), fanout, replace, 99)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a.numpy(), b)


def test_sampler_device_options_are_checked_and_round_trip(monkeypatch) -> None:
    sampler = NeighborSampler([5, 2], device="cpu")
    again = NeighborSampler.from_spec(sampler.spec())
    assert (again.fanouts, again.device, again.graph_memory) == ([5, 2], torch.device("cpu"), "gpu")
    assert NeighborSampler.from_spec(NeighborSampler([3]).spec()).device is None
    with pytest.raises(ConfigError, match="uniform"):
        NeighborSampler([3], prob="w", device="cuda")
    with pytest.raises(ConfigError, match="graph_memory"):
        NeighborSampler([3], device="cpu", graph_memory="disk")
    with pytest.raises(ConfigError, match="CPU or a CUDA"):
        NeighborSampler([3], device="meta")
    if not CUDA:
        with pytest.raises(ConfigError, match="no CUDA"):
            NeighborSampler([3], device="cuda")
    # Worker processes are refused before anything touches the GPU.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    gpu_sampler = NeighborSampler([3], device="cuda:0", graph_memory="pinned")
    assert NeighborSampler.from_spec(gpu_sampler.spec()).graph_memory == "pinned"
    g = InProcessGraph(synthetic(200, 4, feat_dim=2, num_classes=2, seed=0))
    with pytest.raises(ConfigError, match="worker processes"):
        DistNodeDataLoader(g, torch.arange(50), gpu_sampler, 16, num_workers=1)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_loader_with_a_cpu_device_sampler_yields_the_numpy_paths_batches(small_graph: Graph, prefetch: int) -> None:
    g = InProcessGraph(small_graph)
    seeds = torch.arange(0, 3000, 11)

    def epoch(sampler):
        loader = DistNodeDataLoader(
            g, seeds, sampler, 64, shuffle=True, prefetch=prefetch, seed=3, output_feats=["label"]
        )
        with loader:
            return list(loader)

    want, got = epoch(NeighborSampler([4, 3])), epoch(NeighborSampler([4, 3], device="cpu"))
    assert len(got) == len(want) == 5
    for a, b in zip(got, want, strict=True):
        assert_blocks_equal(a, b)
        torch.testing.assert_close(a.output_data["label"], g.ndata["label"][b[1]])


# ---- on a 2-machine LocalCluster: remote seeds by RPC ----


@pytest.fixture(scope="module")
def cluster_graph(tmp_path_factory, small_graph: Graph):
    from distgnn.partition import partition_graph
    from distgnn.train.cluster import LocalCluster

    json_path = partition_graph(small_graph, 2, tmp_path_factory.mktemp("parts") / "g", graph_name="g")
    with LocalCluster(json_path, rpc_timeout_s=30) as cluster:
        yield json_path, cluster


@pytest.mark.parametrize("machine", [0, 1])
def test_cpu_device_blocks_equal_the_numpy_path_on_a_cluster(cluster_graph, machine: int) -> None:
    from distgnn.client.context import connect
    from distgnn.client.graph import DistGraph

    json_path, cluster = cluster_graph
    g = DistGraph("g", json_path, context=connect(cluster.config(machine), rank=machine, world_size=2))
    try:
        owners = g.get_partition_book().nid2partid(np.arange(g.num_nodes()))
        seeds = np.random.default_rng(machine).choice(g.num_nodes(), 300, replace=False)
        assert 0 < np.count_nonzero(owners[seeds] == machine) < len(seeds)
        for fanouts in ([4, 3, 2], [-1]):
            want = NeighborSampler(fanouts).sample_blocks(g, seeds, rng_seed=5)
            got = NeighborSampler(fanouts, device="cpu").sample_blocks(g, seeds, rng_seed=5)
            assert_blocks_equal(got, want)
        # Seeds all owned by the other machine: the one-owner path for remote seeds.
        other = seeds[owners[seeds] != machine]
        assert_blocks_equal(
            NeighborSampler([3, 2], device="cpu").sample_blocks(g, other, rng_seed=6),
            NeighborSampler([3, 2]).sample_blocks(g, other, rng_seed=6),
        )
    finally:
        g.context.close()


def edge_sets(blocks) -> list[set]:
    """Each block's (destination, source, edge id) triples in global ids."""
    out = []
    for block in blocks:
        src_nids = block.src_nids.cpu().numpy()
        counts = np.diff(block.indptr.cpu().numpy())
        dst = np.repeat(src_nids[: block.num_dst], counts)
        out.append(set(zip(dst, src_nids[block.indices.cpu().numpy()], block.eids.cpu().numpy(), strict=True)))
    return out


def replicated_cluster_cases(cluster_graph, device: str) -> None:
    """A replicated sampler on machine 0 of the cluster: no request sent, the output layer's take-all edges those
    of the partitioned sampler (remote seeds included), the input layer's picks real in-edges."""
    from distgnn.client.context import connect
    from distgnn.client.graph import DistGraph
    from distgnn.client.sampling import RpcSampling

    json_path, cluster = cluster_graph
    g = DistGraph("g", json_path, context=connect(cluster.config(0), rank=0, world_size=2))
    replicated = NeighborSampler([4, -1], device=device, structure="replicated")
    try:
        seeds = np.random.default_rng(1).choice(g.num_nodes(), 200, replace=False)
        want = NeighborSampler([-1]).sample_blocks(g, seeds, rng_seed=2)
        sent = []
        original = RpcSampling.send_sample
        RpcSampling.send_sample = lambda self, *a: sent.append(a) or original(self, *a)
        try:
            inputs, outputs, blocks = replicated.sample_blocks(g, seeds, rng_seed=2)
        finally:
            RpcSampling.send_sample = original
        assert sent == []
        assert g.replicated_structure() is g.replicated_structure()  # joined once per DistGraph
        # The last layer takes every in-edge: the same edges as the partitioned sampler, remote seeds included.
        assert edge_sets(blocks[1:]) == edge_sets(want[2])
        # Fanout 4: min(4, degree) real in-edges of each destination.
        (every,) = NeighborSampler([-1]).sample_blocks(g, blocks[0].src_nids[: blocks[0].num_dst].cpu(), 2)[2]
        np.testing.assert_array_equal(
            np.diff(blocks[0].indptr.cpu().numpy()), np.minimum(np.diff(every.indptr.numpy()), 4)
        )
        assert edge_sets(blocks[:1])[0] <= edge_sets([every])[0]
        np.testing.assert_array_equal(inputs.cpu().numpy(), blocks[0].src_nids.cpu().numpy())
    finally:
        replicated.close()
        g.context.close()


def test_a_replicated_sampler_on_a_cluster_sends_no_request_and_samples_real_edges(cluster_graph) -> None:
    replicated_cluster_cases(cluster_graph, "cpu")


@needs_cuda
def test_a_replicated_gpu_sampler_on_a_cluster(cluster_graph) -> None:
    replicated_cluster_cases(cluster_graph, "cuda")


# ---- CUDA ----


@needs_cuda
@pytest.mark.parametrize("graph_memory", ["gpu", "pinned"])
@pytest.mark.parametrize(("fanouts", "replace"), [([5, 3], False), ([4, -1, 2], False), ([3, 3], True)])
def test_gpu_blocks_are_valid(small_graph: Graph, graph_memory: str, fanouts, replace) -> None:
    g = InProcessGraph(small_graph)
    seeds = np.random.default_rng(2).choice(small_graph.num_nodes, 300, replace=False)
    sampler = NeighborSampler(fanouts, replace, device="cuda", graph_memory=graph_memory)
    assert sampler.device == torch.device("cuda", torch.cuda.current_device())
    try:
        result = sampler.sample_blocks(g, seeds, rng_seed=4)
        assert result[0].is_cuda and result[1].is_cuda
        assert all(t.is_cuda for b in result[2] for t in (b.src_nids, b.indptr, b.indices, b.eids))
        check_valid(small_graph, seeds, fanouts, result, replace)
        # The partition is placed once and reused.
        sampler.sample_blocks(g, seeds[:50], rng_seed=5)
        assert len(sampler._backend._placed) == 1
    finally:
        sampler.close()
    assert not sampler._backend._placed


@needs_cuda
@pytest.mark.parametrize("graph_memory", ["gpu", "pinned"])
def test_gpu_take_all_blocks_equal_the_cpu_path(small_graph: Graph, graph_memory: str) -> None:
    g = InProcessGraph(small_graph)
    seeds = np.random.default_rng(3).choice(small_graph.num_nodes, 200, replace=False)
    want = NeighborSampler([-1, -1]).sample_blocks(g, seeds, rng_seed=1)
    sampler = NeighborSampler([-1, -1], device="cuda", graph_memory=graph_memory)
    try:
        got = sampler.sample_blocks(g, seeds, rng_seed=1)
    finally:
        sampler.close()
    assert_blocks_equal(got, want)


def memory_mapped(local: LocalCSC, directory) -> LocalCSC:
    """``local`` with every array read back from its own file as a read-only memory map (as in /dev/shm)."""
    arrays = {}
    for name in ("indptr", "indices", "eids", "local2global"):
        np.save(directory / f"{name}.npy", getattr(local, name))
        arrays[name] = np.load(directory / f"{name}.npy", mmap_mode="r", allow_pickle=False)
    return LocalCSC(local.part_id, local.node_start, edge_weights={}, **arrays)


@needs_cuda
@pytest.mark.parametrize("graph_memory", ["gpu", "pinned"])
@pytest.mark.parametrize("contiguous_eids", [True, False])
@pytest.mark.parametrize("mapped", [False, True])
def test_gpu_device_csc_maps_halo_neighbours_and_edge_ids(
    graph_memory: str, contiguous_eids: bool, mapped: bool, tmp_path
) -> None:
    local = halo_csc(np.random.default_rng(8), contiguous_eids)
    if mapped:
        local = memory_mapped(local, tmp_path)
    csc = on_device.DeviceCSC(local, torch.device("cuda"), graph_memory)
    try:
        assert (csc.eids is None) == contiguous_eids
        assert csc.indptr.is_cuda == csc.indices.is_cuda == (graph_memory == "gpu")
        if graph_memory == "pinned":
            assert csc.indptr.is_pinned() and csc.indices.is_pinned()
            # Pinned copies, never the source memory registered in place.
            assert csc.indices.data_ptr() != local.indices.ctypes.data
        seeds = np.random.default_rng(9).choice(np.arange(500, 900), 200, replace=False)
        counts, src, eids = (t.cpu().numpy() for t in csc.sample(torch.from_numpy(seeds).cuda(), 5, False, 3))
        degree = np.diff(local.indptr)[seeds - 500]
        np.testing.assert_array_equal(counts, np.minimum(degree, 5))
        # Each picked edge id names a CSC position of its seed, and src is that position's source.
        position_of = {int(e): p for p, e in enumerate(local.eids)}
        positions = np.array([position_of[int(e)] for e in eids], dtype=np.int64)
        starts = local.indptr[np.repeat(seeds - 500, counts)]
        ends = local.indptr[np.repeat(seeds - 500, counts) + 1]
        assert np.all((positions >= starts) & (positions < ends))
        np.testing.assert_array_equal(src, local.local2global[local.indices[positions]])
        # Take-all equals the CPU path exactly.
        want = sample_local(local, SampleRequest(seeds, -1, False, None, 3))
        for a, b in zip(csc.sample(torch.from_numpy(seeds).cuda(), -1, False, 3), want, strict=True):
            np.testing.assert_array_equal(a.cpu().numpy(), b)
    finally:
        csc.close()
    assert not on_device.as_tensor(local.indices).is_pinned()  # the source stays ordinary memory


@needs_cuda
@pytest.mark.parametrize("graph_memory", ["gpu", "pinned"])
@pytest.mark.parametrize("contiguous_eids", [True, False])
@pytest.mark.parametrize(("fanout", "replace"), [(0, False), (1, False), (5, False), (5, True), (40, False)])
def test_gpu_sample_block_equals_sampling_then_relabelling(
    graph_memory: str, contiguous_eids: bool, fanout: int, replace: bool
) -> None:
    """The one-sync layer (picks, relabel over the bound, indptr, edge ids in one call) makes the block that
    sampling and relabelling apart make, bit for bit: halo neighbours mapped to global ids, both edge-id forms,
    a fanout past the fused kernel's (40), no seeds; an out-of-range seed is refused by name."""
    local = halo_csc(np.random.default_rng(11), contiguous_eids)
    csc = on_device.DeviceCSC(local, torch.device("cuda"), graph_memory)
    try:
        rng = np.random.default_rng(12)
        for seeds in (rng.choice(np.arange(500, 900), 300, replace=False), np.zeros(0, dtype=np.int64)):
            dst = torch.from_numpy(seeds.astype(np.int64)).cuda()
            (got,) = csc.sample_blocks(dst, [fanout], replace, [17])
            want = on_device.to_block(dst, *csc.sample(dst, fanout, replace, 17), validate=False)
            assert_block_equal(got, want)
            assert got.num_dst == len(seeds)
        with pytest.raises(ValueError, match="seeds must be node ids"):
            csc.sample_blocks(torch.tensor([500, 950], device="cuda"), [5], False, [0])
        with pytest.raises(ValueError, match="rows are global ids"):  # a second layer's seeds are global ids
            csc.sample_blocks(torch.tensor([500, 501], device="cuda"), [5, 5], False, [0, 1])
    finally:
        csc.close()


def assert_block_equal(got, want) -> None:
    assert got.num_dst == want.num_dst
    for field in ("src_nids", "indptr", "indices", "eids"):
        assert torch.equal(getattr(got, field), getattr(want, field)), field


def whole_csc(rng: np.random.Generator, contiguous_eids: bool, replicated: bool) -> LocalCSC:
    """The CSC of a whole graph (rows are global ids): 3000 nodes, degrees 0-40 (a fifth without edges), as the
    replicated structure (no id map) or as the only partition (an identity map and an edge-id range)."""
    num_nodes = 3000
    degrees = rng.integers(0, 41, num_nodes)
    degrees[rng.random(num_nodes) < 0.2] = 0
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(degrees, out=indptr[1:])
    num_edges = int(indptr[-1])
    eids = np.arange(100, 100 + num_edges, dtype=np.int64)
    return LocalCSC(
        part_id=0,
        node_start=0,
        indptr=indptr,
        indices=rng.integers(0, num_nodes, num_edges).astype(np.int64 if replicated else np.int32),
        eids=eids if contiguous_eids else rng.permutation(eids),
        local2global=np.arange(num_nodes, dtype=np.int64),
        edge_weights={},
        replicated=replicated,
    )


@needs_cuda
@pytest.mark.parametrize("graph_memory", ["gpu", "pinned"])
@pytest.mark.parametrize(
    ("replicated", "contiguous_eids"), [(True, True), (False, True), (False, False)], ids=["replicated", "part", "eids"]
)
@pytest.mark.parametrize(
    ("fanouts", "replace"), [([5, 3, 2], False), ([15, 10, 5], True), ([40, 3], False), ([1, 33, 4, 2], False)]
)
def test_gpu_sample_blocks_equal_sampling_layer_by_layer(
    graph_memory: str, replicated: bool, contiguous_eids: bool, fanouts: list[int], replace: bool
) -> None:
    """Every layer of a batch in one call (each layer's seeds the previous block's sources, their count kept on
    the device, every launch over the layer's bound) makes the blocks that sampling and relabelling one layer at
    a time make, bit for bit: with and without an id map, both edge-id forms, fanouts past the fused kernel's
    (40, 33), with replacement, one seed and no seeds."""
    local = whole_csc(np.random.default_rng(21), contiguous_eids, replicated)
    csc = on_device.DeviceCSC(local, torch.device("cuda"), graph_memory)
    rng_seeds = [11, 12, 13, 14][: len(fanouts)]
    try:
        rng = np.random.default_rng(22)
        for seeds in (rng.choice(3000, 64, replace=False), np.array([7]), np.zeros(0, dtype=np.int64)):
            frontier = torch.from_numpy(seeds.astype(np.int64)).cuda()
            got = csc.sample_blocks(frontier, fanouts, replace, rng_seeds)
            assert len(got) == len(fanouts)
            for block, fanout, rng_seed in zip(got, fanouts, rng_seeds, strict=True):
                want = on_device.to_block(frontier, *csc.sample(frontier, fanout, replace, rng_seed), validate=False)
                assert_block_equal(block, want)
                frontier = want.src_nids
    finally:
        csc.close()


@needs_cuda
def test_gpu_sample_blocks_refuses_a_bad_seed_in_any_batch() -> None:
    csc = on_device.DeviceCSC(whole_csc(np.random.default_rng(3), True, True), torch.device("cuda"))
    try:
        with pytest.raises(ValueError, match=r"seeds must be node ids in \[0, 3000\)"):
            csc.sample_blocks(torch.tensor([5, 3000], device="cuda"), [4, 3], False, [0, 1])
        assert len(csc.sample_blocks(torch.tensor([5, 2999], device="cuda"), [4, 3], False, [0, 1])) == 2
    finally:
        csc.close()


@needs_cuda
@pytest.mark.parametrize("fanouts", [[4, 3, 2], [25, 10]])
def test_a_gpu_sampler_makes_a_batch_in_one_call_with_the_blocks_of_layer_by_layer(
    small_graph: Graph, fanouts: list[int], monkeypatch
) -> None:
    """NeighborSampler on a graph of one partition takes the one-call batch; forced layer by layer (the path of
    batches past the bound) it makes the same blocks."""
    g = InProcessGraph(small_graph)
    seeds = np.random.default_rng(5).choice(small_graph.num_nodes, 128, replace=False)
    sampler = NeighborSampler(fanouts, device="cuda")
    calls = []
    real = on_device.DeviceCSC.sample_blocks
    monkeypatch.setattr(
        on_device.DeviceCSC, "sample_blocks", lambda self, *a: calls.append(len(a[1])) or real(self, *a)
    )
    try:
        input_nodes, output_nodes, got = sampler.sample_blocks(g, seeds, rng_seed=9)
        assert calls == [len(fanouts)]  # one call for the batch
        check_valid(small_graph, seeds, fanouts, (input_nodes, output_nodes, got))
        monkeypatch.setattr(on_device, "bounded_batch", lambda *a: False)
        want = sampler.sample_blocks(g, seeds, rng_seed=9)
        assert calls[1:] == [1] * len(fanouts)  # then one call a layer
        assert torch.equal(input_nodes, want[0]) and torch.equal(output_nodes, want[1])
        for block, other in zip(got, want[2], strict=True):
            assert_block_equal(block, other)
    finally:
        sampler.close()


@needs_cuda
@pytest.mark.parametrize("prefetch", [0, 2])
def test_loader_with_a_gpu_sampler_yields_device_batches_with_labels(small_graph: Graph, prefetch: int) -> None:
    g = InProcessGraph(small_graph)
    sampler = NeighborSampler([4, 3], device="cuda")
    loader = DistNodeDataLoader(
        g, torch.arange(0, 3000, 7), sampler, 64, shuffle=True, prefetch=prefetch, output_feats=["label"]
    )
    with loader:
        batches = list(loader)
    sampler.close()
    assert len(batches) == len(loader) > 0
    for batch in batches:
        input_nodes, output_nodes, blocks = batch
        assert input_nodes.is_cuda and output_nodes.is_cuda and all(b.src_nids.is_cuda for b in blocks)
        assert batch.output_data["label"].is_cuda
        torch.testing.assert_close(batch.output_data["label"].cpu(), g.ndata["label"][output_nodes.cpu()])
        check_valid(small_graph, output_nodes.cpu().numpy(), [4, 3], batch)


@needs_cuda
@pytest.mark.parametrize("graph_memory", ["gpu", "pinned"])
def test_gpu_sampling_on_a_cluster_is_valid_and_takes_all_like_the_cpu(cluster_graph, graph_memory: str) -> None:
    """The real case: the local partition from /dev/shm on the GPU (or a pinned copy), remote seeds by RPC."""
    from distgnn.client.context import connect
    from distgnn.client.graph import DistGraph

    json_path, cluster = cluster_graph
    g = DistGraph("g", json_path, context=connect(cluster.config(0), rank=0, world_size=2))
    sampler = NeighborSampler([-1, -1], device="cuda", graph_memory=graph_memory)
    few = NeighborSampler([4], device="cuda", graph_memory=graph_memory)
    try:
        seeds = np.random.default_rng(4).choice(g.num_nodes(), 300, replace=False)
        assert_blocks_equal(sampler.sample_blocks(g, seeds, 2), NeighborSampler([-1, -1]).sample_blocks(g, seeds, 2))
        (placed,) = sampler._backend._placed.values()
        assert (
            placed.indices.is_cuda == (graph_memory == "gpu") and placed.indices.is_pinned() != placed.indices.is_cuda
        )
        # Fanout 4: every picked edge is one of the seed's in-edges, with its source; counts min(4, degree).
        (every,) = NeighborSampler([-1]).sample_blocks(g, seeds, 2)[2]
        (block,) = few.sample_blocks(g, seeds, 3)[2]
        check_picks_among(block.to("cpu"), every, 4)
    finally:
        sampler.close()
        few.close()
        g.context.close()
