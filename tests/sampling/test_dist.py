"""Multi-layer NeighborSampler: blocks hold real edges, right counts, destination-first order.

Runs on the in-process single-partition graph and on a 2-machine LocalCluster
(remote seeds sampled by the owner's server, local ones in-process).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from distgnn.data import synthetic
from distgnn.data.graph import Graph
from distgnn.sampling.neighbor import InProcessGraph, NeighborSampler, _merge


def check_blocks(
    graph: Graph,
    orig_nid: np.ndarray,
    orig_eid: np.ndarray,
    seeds: np.ndarray,
    sampler: NeighborSampler,
    result,
) -> None:
    """Every property a sampled mini-batch must have, checked against the original graph.

    ``orig_nid``/``orig_eid`` map the sampler's (possibly reshuffled) ids to ``graph``'s.
    """
    input_nodes, output_nodes, blocks = result
    in_degree = np.bincount(graph.dst, minlength=graph.num_nodes)
    assert len(blocks) == len(sampler.fanouts)
    np.testing.assert_array_equal(output_nodes.numpy(), seeds)
    np.testing.assert_array_equal(input_nodes.numpy(), blocks[0].src_nids.numpy())
    dst = seeds
    for layer in reversed(range(len(blocks))):
        block, fanout = blocks[layer], sampler.fanouts[layer]
        src_nids = block.src_nids.numpy()
        # Destination nodes first among the sources, sources unique.
        assert block.num_dst == len(dst)
        np.testing.assert_array_equal(src_nids[: block.num_dst], dst)
        assert len(np.unique(src_nids)) == len(src_nids)
        # Counts: min(fanout, in-degree) without replacement.
        counts = (block.indptr[1:] - block.indptr[:-1]).numpy()
        want = in_degree[orig_nid[dst]]
        np.testing.assert_array_equal(counts, want if fanout == -1 else np.minimum(want, fanout))
        # Every edge is a real edge of the graph, pointing into its destination, no edge twice per node.
        eids = orig_eid[block.eids.numpy()]
        edge_src = orig_nid[src_nids[block.indices.numpy()]]
        edge_dst = orig_nid[np.repeat(dst, counts)]
        np.testing.assert_array_equal(graph.src[eids], edge_src)
        np.testing.assert_array_equal(graph.dst[eids], edge_dst)
        assert len(np.unique(block.eids.numpy())) == block.num_edges
        # Sources beyond the destinations are exactly the sampled neighbours (first-appearance order).
        _, first = np.unique(src_nids[block.indices.numpy()], return_index=True)
        appeared = src_nids[block.indices.numpy()][np.sort(first)]
        np.testing.assert_array_equal(src_nids[block.num_dst :], appeared[~np.isin(appeared, dst)])
        dst = src_nids


def test_merge_scatters_owner_groups_back_into_seed_order() -> None:
    rng = np.random.default_rng(0)
    num_seeds = 50
    owner = rng.integers(0, 3, num_seeds)
    counts = rng.integers(0, 5, num_seeds)
    # Each seed's edges are (seed * 100 + j): easy to check the order.
    wheres, results = [], []
    for part in range(3):
        where = np.flatnonzero(owner == part)
        src = np.concatenate([s * 100 + np.arange(counts[s]) for s in where]) if len(where) else np.zeros(0, np.int64)
        wheres.append(where)
        results.append((counts[where], src.astype(np.int64), -src.astype(np.int64)))
    got_counts, got_src, got_eids = _merge(num_seeds, wheres, results)
    want = np.concatenate([s * 100 + np.arange(counts[s]) for s in range(num_seeds)])
    np.testing.assert_array_equal(got_counts, counts)
    np.testing.assert_array_equal(got_src, want)
    np.testing.assert_array_equal(got_eids, -want)


@pytest.fixture(scope="module")
def small_graph() -> Graph:
    return synthetic(3000, 8, feat_dim=4, num_classes=4, seed=3)


@pytest.mark.parametrize("fanouts", [[5, 3], [4, -1, 2]])
def test_in_process_sampler_blocks_are_real_edges(small_graph: Graph, fanouts) -> None:
    g = InProcessGraph(small_graph)
    sampler = NeighborSampler(fanouts)
    seeds = np.random.default_rng(1).choice(small_graph.num_nodes, 200, replace=False)
    identity = np.arange(max(small_graph.num_nodes, small_graph.num_edges))
    check_blocks(small_graph, identity, identity, seeds, sampler, sampler.sample_blocks(g, seeds, rng_seed=7))


def test_sampling_is_reproducible_for_a_seed_and_varies_across_seeds(small_graph: Graph) -> None:
    g = InProcessGraph(small_graph)
    sampler = NeighborSampler([3, 3])
    seeds = torch.arange(0, 3000, 7)
    a = sampler.sample_blocks(g, seeds, rng_seed=11)
    b = sampler.sample_blocks(g, seeds, rng_seed=11)
    c = sampler.sample_blocks(g, seeds, rng_seed=12)
    for x, y in zip(a[2], b[2], strict=True):
        torch.testing.assert_close(x.eids, y.eids)
    assert not torch.equal(a[2][1].eids, c[2][1].eids)


def test_sampler_spec_round_trips_and_rejects_bad_fanouts() -> None:
    sampler = NeighborSampler([15, 10, 5], replace=True, prob="w")
    again = NeighborSampler.from_spec(sampler.spec())
    assert (again.fanouts, again.replace, again.prob) == ([15, 10, 5], True, "w")
    for bad in ([], [0], [3, -2]):
        with pytest.raises(Exception, match="fanouts"):
            NeighborSampler(bad)


# -- on a 2-machine LocalCluster ------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster_graph(tmp_path_factory, small_graph: Graph):
    """``small_graph`` with a sparse edge weight, METIS-partitioned in 2 and served by a LocalCluster."""
    from distgnn.partition import partition_graph
    from distgnn.partition.format import load_orig_ids, read_meta
    from distgnn.train.cluster import LocalCluster

    rng = np.random.default_rng(5)
    weighted = Graph(
        small_graph.name,
        small_graph.num_nodes,
        small_graph.src,
        small_graph.dst,
        dict(small_graph.ndata),
        {
            "w": np.where(rng.random(small_graph.num_edges) < 0.5, 0.0, rng.random(small_graph.num_edges)).astype(
                np.float32
            )
        },
        small_graph.num_classes,
    )
    json_path = partition_graph(weighted, 2, tmp_path_factory.mktemp("parts") / "g", graph_name="g")
    orig_nid, orig_eid = (np.asarray(a) for a in load_orig_ids(read_meta(json_path)))
    with LocalCluster(json_path, servers_per_machine=2, rpc_timeout_s=30) as cluster:
        yield weighted, json_path, cluster, orig_nid, orig_eid


def dist_graph(cluster, json_path, machine: int):
    from distgnn.client.context import connect
    from distgnn.client.graph import DistGraph

    return DistGraph("g", json_path, context=connect(cluster.config(machine), rank=machine, world_size=2))


@pytest.mark.parametrize("machine", [0, 1])
def test_cluster_sampler_blocks_are_real_edges(cluster_graph, machine: int) -> None:
    graph, json_path, cluster, orig_nid, orig_eid = cluster_graph
    g = dist_graph(cluster, json_path, machine)
    try:
        book = g.get_partition_book()
        owners = book.nid2partid(np.arange(graph.num_nodes))
        assert set(np.unique(owners)) == {0, 1}
        # Seeds from both machines, interleaved, so the merge has to restore the order.
        seeds = np.random.default_rng(machine).choice(graph.num_nodes, 300, replace=False)
        assert 0 < np.count_nonzero(owners[seeds] == machine) < len(seeds)
        sampler = NeighborSampler([4, 3, 2])
        result = sampler.sample_blocks(g, seeds, rng_seed=3)
        check_blocks(graph, orig_nid, orig_eid, seeds, sampler, result)
        again = sampler.sample_blocks(g, seeds, rng_seed=3)
        for a, b in zip(result[2], again[2], strict=True):
            torch.testing.assert_close(a.eids, b.eids)
    finally:
        g.context.close()


def test_cluster_weighted_sampling_skips_zero_weight_edges(cluster_graph) -> None:
    graph, json_path, cluster, orig_nid, orig_eid = cluster_graph
    g = dist_graph(cluster, json_path, 0)
    try:
        seeds = np.arange(0, graph.num_nodes, 3)
        _, _, (block,) = NeighborSampler([3], prob="w").sample_blocks(g, seeds, rng_seed=1)
        weight = graph.edata["w"]
        assert np.all(weight[orig_eid[block.eids.numpy()]] > 0)
        nonzero = np.bincount(graph.dst[weight > 0], minlength=graph.num_nodes)
        counts = (block.indptr[1:] - block.indptr[:-1]).numpy()
        np.testing.assert_array_equal(counts, np.minimum(nonzero[orig_nid[seeds]], 3))
    finally:
        g.context.close()


def test_torch_parallel_kernels_stay_correct_after_local_sampling(small_graph: Graph) -> None:
    """Sampling in the trainer's own thread must not change how torch runs its parallel CPU kernels
    (the OpenMP settings of the C++ sampler leak into the calling thread)."""
    from distgnn.nn import aggregate

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        g = InProcessGraph(small_graph)
        NeighborSampler([10, 10]).sample_blocks(g, np.arange(0, 3000, 2), rng_seed=1)
        block = NeighborSampler([-1]).sample_blocks(g, np.arange(3000), rng_seed=1)[2][0]
        x = torch.randn(block.num_src, 64, generator=torch.Generator().manual_seed(0))
        adj = torch.zeros(block.num_dst, block.num_src)
        adj.index_put_((block.dst_index(), block.indices), torch.ones(block.num_edges), accumulate=True)
        want = adj @ x / adj.sum(1, keepdim=True).clamp(min=1)
        for _ in range(3):
            torch.testing.assert_close(aggregate.mean(block, x), want, atol=1e-4, rtol=1e-4)
    finally:
        torch.set_num_threads(threads)
