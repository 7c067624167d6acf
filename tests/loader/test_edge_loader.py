"""DistEdgeDataLoader: pairs, negatives and exclusion in-process and on a 2-machine LocalCluster."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from distgnn.data import synthetic
from distgnn.data.graph import Graph
from distgnn.data.link_split import reverse_edge_ids
from distgnn.errors import ConfigError, InputError
from distgnn.loader.edge import DistEdgeDataLoader
from distgnn.sampling.block import Block
from distgnn.sampling.edges import find_edges
from distgnn.sampling.exclude import drop_edges
from distgnn.sampling.negative import DegreeBiased, PerSourceUniform, Uniform, all_in_degrees
from distgnn.sampling.neighbor import InProcessGraph, NeighborSampler


def _symmetric(num_nodes=300, num_pairs=1200, seed=0) -> tuple[Graph, np.ndarray]:
    rng = np.random.default_rng(seed)
    u, v = rng.integers(0, num_nodes, num_pairs), rng.integers(0, num_nodes, num_pairs)
    keep = u != v
    src, dst = np.concatenate([u[keep], v[keep]]), np.concatenate([v[keep], u[keep]])
    feat = rng.standard_normal((num_nodes, 4)).astype(np.float32)
    return Graph("sym", num_nodes, src, dst, ndata={"feat": feat}), reverse_edge_ids(src, dst)


def _all_block_eids(blocks) -> np.ndarray:
    return np.concatenate([b.eids.numpy() for b in blocks])


def test_reverse_edge_ids_point_at_the_opposite_edge():
    graph, rev = _symmetric()
    np.testing.assert_array_equal(graph.src[rev], graph.dst)
    np.testing.assert_array_equal(graph.dst[rev], graph.src)
    np.testing.assert_array_equal(reverse_edge_ids(np.array([0, 1]), np.array([1, 2])), [0, 1])


@pytest.mark.parametrize("negative", [Uniform(3), PerSourceUniform(2), DegreeBiased(2)], ids=repr)
def test_pairs_are_the_seed_edges_and_their_negatives(negative):
    graph, _ = _symmetric()
    g = InProcessGraph(graph)
    seeds = torch.arange(0, graph.num_edges, 3)
    loader = DistEdgeDataLoader(
        g, seeds, NeighborSampler([4, 4]), negative, batch_size=50, shuffle=True, input_feats=("feat",)
    )
    seen = []
    for input_nodes, pos, neg, blocks in loader:
        out = blocks[-1].dst_nids
        torch.testing.assert_close(pos.node_ids, out)
        assert bool((out[1:] > out[:-1]).all())  # unique, ascending
        src, dst = pos.global_edges()
        np.testing.assert_array_equal(src.numpy(), graph.src[pos.eids.numpy()])
        np.testing.assert_array_equal(dst.numpy(), graph.dst[pos.eids.numpy()])
        neg_src, neg_dst = neg.global_edges()
        per_pos = len(np.unique(src)) if isinstance(negative, PerSourceUniform) else pos.num_edges
        assert neg.num_edges == negative.k * per_pos and neg.eids is None
        assert set(neg_src.tolist()) <= set(src.tolist()) and int(neg_dst.max()) < graph.num_nodes
        torch.testing.assert_close(input_nodes, blocks[0].src_nids)
        seen.append(pos.eids.numpy())
    seen = np.concatenate(seen)
    np.testing.assert_array_equal(np.sort(seen), seeds.numpy())


@pytest.mark.parametrize("exclude", [None, "self", "reverse_id"])
def test_exclusion_removes_the_seed_edges_and_their_reverses_from_the_blocks(exclude):
    graph, rev = _symmetric()
    g = InProcessGraph(graph)
    seeds = torch.arange(graph.num_edges)
    loader = DistEdgeDataLoader(
        g,
        seeds,
        NeighborSampler([-1, -1]),
        Uniform(1),
        exclude=exclude,
        reverse_eids=torch.from_numpy(rev),
        batch_size=64,
        shuffle=True,
    )
    leaked_self = leaked_reverse = 0
    for _, pos, _, blocks in loader:
        eids = _all_block_eids(blocks)
        leaked_self += np.isin(pos.eids.numpy(), eids).sum()
        leaked_reverse += np.isin(rev[pos.eids.numpy()], eids).sum()
        for block in blocks:  # still a well-formed CSC over the same source nodes
            assert int(block.indptr[-1]) == block.num_edges and bool((block.indptr[1:] >= block.indptr[:-1]).all())
            np.testing.assert_array_equal(block.src_nids[block.indices].numpy(), graph.src[block.eids.numpy()])
            np.testing.assert_array_equal(block.dst_nids[block.dst_index()].numpy(), graph.dst[block.eids.numpy()])
    if exclude is None:
        assert leaked_self > 0 and leaked_reverse > 0  # full neighbourhoods hold every seed edge
    else:
        assert leaked_self == 0
        assert (leaked_reverse == 0) == (exclude == "reverse_id")


def test_reverse_id_reads_the_graphs_reverse_eid_edge_array_when_not_given():
    graph, rev = _symmetric()
    graph.edata["reverse_eid"] = rev[::-1].copy()  # not the true reverses: which mapping was used shows
    g = InProcessGraph(graph)

    def excluded_in_first_batch(reverse_eids) -> np.ndarray:
        loader = DistEdgeDataLoader(
            g, torch.arange(60), NeighborSampler([-1]), exclude="reverse_id", reverse_eids=reverse_eids, batch_size=60
        )
        _, pos, blocks = next(iter(loader))
        kept = _all_block_eids(blocks)
        return np.setdiff1d(np.concatenate([pos.eids.numpy(), rev, rev[::-1]]), kept)

    by_default = excluded_in_first_batch(None)
    np.testing.assert_array_equal(by_default, excluded_in_first_batch(torch.from_numpy(rev[::-1].copy())))
    assert not np.array_equal(by_default, excluded_in_first_batch(torch.from_numpy(rev)))


def _drop_reference(block: Block, eids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    indptr, indices, block_eids = [0], [], []
    for d in range(block.num_dst):
        for p in range(int(block.indptr[d]), int(block.indptr[d + 1])):
            if int(block.eids[p]) not in set(eids.tolist()):
                indices.append(int(block.indices[p]))
                block_eids.append(int(block.eids[p]))
        indptr.append(len(indices))
    return np.array(indptr), np.array(indices, dtype=np.int64), np.array(block_eids, dtype=np.int64)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_drop_edges_matches_a_per_edge_reference(seed):
    rng = np.random.default_rng(seed)
    num_dst, num_src = 20, 45
    counts = rng.integers(0, 5, num_dst)
    indptr = np.concatenate([[0], np.cumsum(counts)])
    block = Block(
        torch.from_numpy(rng.permutation(1000)[:num_src]),
        num_dst,
        torch.from_numpy(indptr),
        torch.from_numpy(rng.integers(0, num_src, indptr[-1])),
        torch.from_numpy(rng.permutation(500)[: indptr[-1]]),
        torch.from_numpy(rng.integers(0, 3, indptr[-1])),  # typed: edge and source node types
        torch.from_numpy(rng.integers(0, 2, num_src)),
    )
    eids = rng.choice(block.eids.numpy(), size=indptr[-1] // 3) if indptr[-1] else np.zeros(0, np.int64)
    eids = np.concatenate([eids, [10_000]])  # an id of no edge of the block
    dropped = drop_edges(block, torch.from_numpy(eids))
    ref_indptr, ref_indices, ref_eids = _drop_reference(block, eids)
    np.testing.assert_array_equal(dropped.indptr.numpy(), ref_indptr)
    np.testing.assert_array_equal(dropped.indices.numpy(), ref_indices)
    np.testing.assert_array_equal(dropped.eids.numpy(), ref_eids)
    etype_of = dict(zip(block.eids.tolist(), block.etypes.tolist(), strict=True))
    np.testing.assert_array_equal(dropped.etypes.numpy(), [etype_of[e] for e in ref_eids.tolist()])
    assert dropped.src_nids is block.src_nids and dropped.num_dst == num_dst
    assert dropped.src_ntypes is block.src_ntypes


def test_without_a_negative_sampler_the_batch_is_a_triple():
    graph, _ = _symmetric()
    loader = DistEdgeDataLoader(InProcessGraph(graph), torch.arange(10), NeighborSampler([2]), batch_size=5)
    batches = list(loader)
    assert len(batches) == 2 and all(len(b) == 3 and b.neg_graph is None for b in batches)


def test_a_batch_lists_every_tensor_it_holds():
    """The GPU hand-over (a batch made on a side stream) keeps alive exactly what ``tensors()`` lists."""
    from distgnn.sampling.negative import Uniform

    graph, _ = _symmetric()
    loader = DistEdgeDataLoader(
        InProcessGraph(graph), torch.arange(10), NeighborSampler([2, 2]), negative_sampler=Uniform(2), batch_size=5
    )
    batch = next(iter(loader))
    listed = {id(t) for t in batch.tensors()}
    pos, neg, blocks = batch.pos_graph, batch.neg_graph, batch.blocks
    held = [batch.input_nodes, pos.src, pos.dst, pos.node_ids, pos.eids, neg.src, neg.dst, neg.node_ids]
    held += [t for b in blocks for t in (b.src_nids, b.indptr, b.indices, b.eids)]
    assert all(id(t) in listed for t in held) and batch.ready is None


def test_bad_input_is_refused_before_sampling():
    graph, rev = _symmetric()
    g = InProcessGraph(graph)
    sampler = NeighborSampler([2])
    seeds = torch.arange(10)
    with pytest.raises(ConfigError, match="unknown negative sampler"):
        DistEdgeDataLoader(g, seeds, sampler, negative_sampler="uniform", batch_size=4)
    with pytest.raises(ConfigError, match="needs reverse_eids"):
        DistEdgeDataLoader(g, seeds, sampler, exclude="reverse_id", batch_size=4)
    with pytest.raises(InputError, match="one entry per edge"):
        DistEdgeDataLoader(
            g, seeds, sampler, exclude="reverse_id", reverse_eids=torch.from_numpy(rev[:-1]), batch_size=4
        )
    with pytest.raises(InputError, match="out of range"):
        DistEdgeDataLoader(g, torch.tensor([0, graph.num_edges]), sampler, batch_size=4)
    with pytest.raises(ConfigError, match="heterogeneous"):
        DistEdgeDataLoader(g, seeds, sampler, exclude="reverse_types", batch_size=4)
    with pytest.raises(ConfigError, match="exclude must be one of"):
        DistEdgeDataLoader(g, seeds, sampler, exclude="both", batch_size=4)
    with pytest.raises(ConfigError, match="k >= 1"):
        Uniform(0)


# -- on a LocalCluster ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from distgnn.partition import partition_graph
    from distgnn.train.cluster import LocalCluster

    graph = synthetic(1500, 5, feat_dim=4, num_classes=3, seed=3)
    rng = np.random.default_rng(3)
    graph.edata["train_mask"] = rng.random(graph.num_edges) < 0.5
    graph.edata["w"] = rng.random((graph.num_edges, 2)).astype(np.float32)
    json_path = partition_graph(graph, 2, tmp_path_factory.mktemp("parts") / "g", graph_name="g", method="random")
    with LocalCluster(json_path, rpc_timeout_s=30) as c:
        yield c, json_path, graph


def _open(cluster, json_path, machine: int):
    from distgnn.client.context import connect
    from distgnn.client.graph import DistGraph

    return DistGraph("g", json_path, context=connect(cluster.config(machine), rank=machine, world_size=2))


def _new_id_edges(json_path, graph):
    from distgnn.partition.format import load_orig_ids, read_meta

    orig_nid, orig_eid = load_orig_ids(read_meta(json_path), mmap=False)
    new_of_orig = np.argsort(orig_nid)
    return new_of_orig[graph.src[orig_eid]], new_of_orig[graph.dst[orig_eid]]


def test_find_edges_reads_local_and_remote_edges(cluster):
    c, json_path, graph = cluster
    src, dst = _new_id_edges(json_path, graph)
    g = _open(c, json_path, 0)
    try:
        eids = np.random.default_rng(0).permutation(graph.num_edges)[:400]
        assert (g.get_partition_book().eid2partid(eids) == 1).any()
        found_src, found_dst = find_edges(g, eids)
        np.testing.assert_array_equal(found_src.numpy(), src[eids])
        np.testing.assert_array_equal(found_dst.numpy(), dst[eids])
        # The degree-biased sampler's table: every node's in-degree, local and remote.
        np.testing.assert_array_equal(all_in_degrees(g), np.bincount(dst, minlength=graph.num_nodes))
    finally:
        g.context.close()


def test_cluster_loader_excludes_by_a_dist_tensor_of_reverse_ids(cluster):
    from distgnn.client.split import edge_split
    from distgnn.client.tensor import DistTensor

    c, json_path, graph = cluster
    src, dst = _new_id_edges(json_path, graph)
    rev = reverse_edge_ids(src, dst)
    g = _open(c, json_path, 1)
    try:
        table = DistTensor((graph.num_edges,), torch.int64, name="rev-test", part_policy="edge", context=g.context)
        table[torch.arange(graph.num_edges)] = torch.from_numpy(rev)
        seeds = edge_split(np.ones(graph.num_edges, bool), g.get_partition_book(), rank=1, world_size=2)
        kwargs = dict(exclude="reverse_id", reverse_eids=table, batch_size=40, shuffle=True, seed=4)
        sampler = NeighborSampler([-1, 3])
        inline = DistEdgeDataLoader(g, seeds, sampler, Uniform(2), **kwargs)
        with DistEdgeDataLoader(g, seeds, sampler, Uniform(2), num_workers=1, **kwargs) as workers:
            for a, b in zip(inline, workers, strict=True):
                np.testing.assert_array_equal(a.pos_graph.eids.numpy(), b.pos_graph.eids.numpy())
                np.testing.assert_array_equal(a.neg_graph.dst.numpy(), b.neg_graph.dst.numpy())
                for block_a, block_b in zip(a.blocks, b.blocks, strict=True):
                    np.testing.assert_array_equal(block_a.eids.numpy(), block_b.eids.numpy())
                pos_eids = a.pos_graph.eids.numpy()
                p_src, p_dst = a.pos_graph.global_edges()
                np.testing.assert_array_equal(p_src.numpy(), src[pos_eids])
                np.testing.assert_array_equal(p_dst.numpy(), dst[pos_eids])
                block_eids = _all_block_eids(a.blocks)
                assert not np.isin(pos_eids, block_eids).any() and not np.isin(rev[pos_eids], block_eids).any()
    finally:
        g.context.close()


def test_partitioned_edge_data_is_served_as_edata_and_splits(cluster):
    from distgnn.client.split import edge_split
    from distgnn.partition.format import load_orig_ids, read_meta

    c, json_path, graph = cluster
    _, orig_eid = load_orig_ids(read_meta(json_path), mmap=False)
    g = _open(c, json_path, 0)
    try:
        every = torch.arange(graph.num_edges)
        mask = g.edata["train_mask"][every].numpy()
        np.testing.assert_array_equal(mask, graph.edata["train_mask"][orig_eid])
        np.testing.assert_array_equal(g.edata["w"][every].numpy(), graph.edata["w"][orig_eid])
        book = g.get_partition_book()
        for rank in range(2):
            from_tensor = edge_split(g.edata["train_mask"], book, rank=rank, world_size=2)
            np.testing.assert_array_equal(from_tensor.numpy(), edge_split(mask, book, rank=rank, world_size=2).numpy())
            assert mask[from_tensor.numpy()].all()
    finally:
        g.context.close()
