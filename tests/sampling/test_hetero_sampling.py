"""Typed runtime and sampling on a 2-machine LocalCluster: per-type DistTensors, node_split by type, and
typed neighbour sampling whose every edge is a real edge of its type, within its type's fanout."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hetero_graphs import ETYPES, toy_hetero

from distgnn.data.hetero import ChunkedArray
from distgnn.errors import ConfigError

OFFSETS = {"a": 0, "b": 60, "c": 100}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from distgnn.partition import partition_graph
    from distgnn.partition.format import load_orig_ids, read_meta
    from distgnn.train.cluster import LocalCluster

    graph = toy_hetero(3)
    json_path = partition_graph(graph, 2, tmp_path_factory.mktemp("hetero") / "g", graph_name="g")
    orig_nid, orig_eid = (np.asarray(a) for a in load_orig_ids(read_meta(json_path)))
    with LocalCluster(json_path, servers_per_machine=2, rpc_timeout_s=30) as cluster:
        yield graph, json_path, cluster, orig_nid, orig_eid


def dist_graph(cluster, json_path, machine: int):
    from distgnn.client.context import connect
    from distgnn.client.graph import DistGraph

    return DistGraph("g", json_path, context=connect(cluster.config(machine), rank=machine, world_size=2))


def test_typed_graph_answers_types_counts_and_features(served):
    graph, json_path, cluster, orig_nid, _ = served
    g = dist_graph(cluster, json_path, 1)
    try:
        assert g.ntypes == ["a", "b", "c"] and g.canonical_etypes == ETYPES
        assert [g.num_nodes(t) for t in g.ntypes] == [60, 40, 15] and g.num_nodes() == 115
        assert g.num_edges("r4") == len(graph.edges[ETYPES[3]][0])
        assert g.ndata == {} and set(g.nodes["a"].data) == {"feat", "label", "train_mask"}
        book = g.get_partition_book()
        for ntype in ("a", "b"):
            ids = np.arange(g.num_nodes(ntype))
            orig = orig_nid[book.map_to_homo_nid(ids, ntype)] - OFFSETS[ntype]
            feat = graph.ndata[ntype]["feat"]
            feat = feat.read() if isinstance(feat, ChunkedArray) else feat
            torch.testing.assert_close(g.nodes[ntype].data["feat"][torch.from_numpy(ids)], torch.from_numpy(feat[orig]))
        w = g.edges["a:r1:b"].data["w"]
        assert len(w) == g.num_edges(ETYPES[0])
        import distgnn

        mask = g.nodes["a"].data["train_mask"]
        shares = [distgnn.node_split(mask, book, rank=r, world_size=2, ntype="a") for r in range(2)]
        everything = torch.sort(torch.cat(shares)).values
        assert torch.equal(everything, torch.nonzero(mask[torch.arange(60)]).flatten())
        # The in-degree over all edge types of a node.
        homo = np.arange(115)
        dst_all = np.concatenate([graph.edges[e][1] + OFFSETS[e[2]] for e in ETYPES])
        expect = np.bincount(dst_all, minlength=115)[orig_nid[homo]]
        assert np.array_equal(g.in_degrees(homo).numpy(), expect)
    finally:
        g.context.close()


def check_typed_blocks(graph, book, orig_nid, orig_eid, sampler, blocks) -> None:
    """Every block edge is a real edge of its type; per (destination, edge type) min(fanout, degree) picks."""
    edge_offsets = np.cumsum([0] + [len(graph.edges[e][0]) for e in ETYPES])
    all_dst = np.concatenate([graph.edges[e][1] + OFFSETS[e[2]] for e in ETYPES])
    all_etype = np.repeat(np.arange(len(ETYPES)), np.diff(edge_offsets))
    for layer, block in enumerate(blocks):
        fanout = sampler.fanouts[layer]
        per_type = [fanout] * 4 if isinstance(fanout, int) else [0] * 4
        if isinstance(fanout, dict):
            for key, k in fanout.items():
                per_type[book.etype_id(key)] = k
        src = block.src_nids[block.indices].numpy()
        dst = block.dst_nids[block.dst_index()].numpy()
        etypes = block.etypes.numpy()
        assert np.array_equal(block.src_ntypes.numpy(), book.map_to_per_ntype(block.src_nids.numpy())[0])
        orig = orig_eid[block.eids.numpy()]
        assert np.array_equal(np.searchsorted(edge_offsets[1:], orig, side="right"), etypes)
        for k, (s, r, d) in enumerate(ETYPES):
            mine = etypes == k
            per = orig[mine] - edge_offsets[k]
            assert np.array_equal(orig_nid[src[mine]] - OFFSETS[s], graph.edges[(s, r, d)][0][per])
            assert np.array_equal(orig_nid[dst[mine]] - OFFSETS[d], graph.edges[(s, r, d)][1][per])
        # Per (destination, edge type): min(fanout, that type's in-degree) picks, no edge twice.
        for v in block.dst_nids.numpy():
            o = orig_nid[v]
            for k in range(4):
                degree = int(np.count_nonzero((all_dst == o) & (all_etype == k)))
                got = int(np.count_nonzero((dst == v) & (etypes == k)))
                want = degree if per_type[k] == -1 else min(per_type[k], degree)
                assert got == want, (layer, v, k)
        assert len(np.unique(block.eids.numpy())) == block.num_edges


@pytest.mark.parametrize("structure", ["partitioned", "replicated"])
@pytest.mark.parametrize("fanouts", [[3, 2], [{"r1": 2, "r2": -1, ("a", "r3", "a"): 1, "c:r4:b": 0}, 2]])
def test_typed_blocks_hold_real_edges_of_each_type_within_fanouts(served, fanouts, structure):
    from distgnn.sampling.neighbor import NeighborSampler

    graph, json_path, cluster, orig_nid, orig_eid = served
    g = dist_graph(cluster, json_path, 0)
    try:
        book = g.get_partition_book()
        rng = np.random.default_rng(0)
        seeds = np.concatenate(
            [book.map_to_homo_nid(rng.choice(60, 12, replace=False), "a"), book.map_to_homo_nid([1, 10, 39], "b")]
        )
        owners = book.nid2partid(seeds)
        assert 0 < np.count_nonzero(owners == 0) < len(seeds)  # local and remote items
        sampler = NeighborSampler(fanouts, structure=structure)  # replicated: every typed item sampled here
        input_nodes, output_nodes, blocks = sampler.sample_blocks(g, seeds, rng_seed=4)
        assert np.array_equal(output_nodes.numpy(), seeds) and torch.equal(input_nodes, blocks[0].src_nids)
        check_typed_blocks(graph, book, orig_nid, orig_eid, sampler, blocks)
    finally:
        g.context.close()


def test_typed_fanouts_name_real_edge_types(served):
    from distgnn.sampling.neighbor import NeighborSampler

    _, json_path, cluster, _, _ = served
    g = dist_graph(cluster, json_path, 0)
    try:
        with pytest.raises(ConfigError, match="nope"):
            NeighborSampler([{"nope": 2}]).sample_blocks(g, np.array([0]))
        with pytest.raises(ConfigError, match="samples no edge type"):
            NeighborSampler([{"r1": 0}])
    finally:
        g.context.close()


def test_in_process_typed_graph_samples_the_same_way():
    from distgnn.sampling.neighbor import NeighborSampler
    from distgnn.sampling.source import InProcessGraph

    graph = toy_hetero(5)
    g = InProcessGraph(graph)
    book = g.get_partition_book()
    assert g.ntypes == ["a", "b", "c"] and g.num_nodes("b") == 40
    identity_n, identity_e = np.arange(g.num_nodes()), np.arange(g.num_edges())
    sampler = NeighborSampler([2, {"r1": 1, "r2": 3, "r3": -1}])
    seeds = np.concatenate([book.map_to_homo_nid(np.arange(0, 60, 7), "a"), book.map_to_homo_nid([0, 5], "b")])
    _, _, blocks = sampler.sample_blocks(g, seeds, rng_seed=1)
    check_typed_blocks(graph, book, identity_n, identity_e, sampler, blocks)
    torch.testing.assert_close(g.nodes["a"].data["feat"], torch.from_numpy(graph.ndata["a"]["feat"]))


def test_typed_loader_yields_per_type_nodes_of_its_blocks(served):
    from distgnn.loader.node import DistNodeDataLoader
    from distgnn.sampling.neighbor import NeighborSampler

    graph, json_path, cluster, orig_nid, orig_eid = served
    g = dist_graph(cluster, json_path, 0)
    try:
        book = g.get_partition_book()
        seeds = {"a": torch.arange(0, 60, 3), "b": torch.tensor([2, 4])}
        loader = DistNodeDataLoader(g, seeds, NeighborSampler([2, 2]), batch_size=8, shuffle=True, rank=0)
        seen = {"a": [], "b": []}
        for input_nodes, output_nodes, blocks in loader:
            assert set(input_nodes) == {"a", "b", "c"}
            src_types = blocks[0].src_ntypes
            for t, name in enumerate(g.ntypes):
                expect = book.map_to_per_ntype(blocks[0].src_nids[src_types == t])[1]
                assert torch.equal(input_nodes[name], expect)
            for name in ("a", "b"):
                seen[name].append(output_nodes[name])
        assert torch.equal(torch.sort(torch.cat(seen["a"])).values, seeds["a"])
        assert torch.equal(torch.sort(torch.cat(seen["b"])).values, seeds["b"])
    finally:
        g.context.close()


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fanouts", [[2, 3], [{"r1": 1, "r2": 3, "r3": -1}, {"r4": 2, "r1": 2}]])
def test_typed_sampling_on_a_device_holds_real_edges_within_fanouts(device, fanouts):
    """The torch path (``device="cpu"``) and the GPU sampler (``"cuda"``, one launch per distinct fanout)."""
    from distgnn.sampling.neighbor import NeighborSampler
    from distgnn.sampling.source import InProcessGraph

    graph = toy_hetero(7)
    g = InProcessGraph(graph)
    book = g.get_partition_book()
    sampler = NeighborSampler(fanouts, device=device)
    seeds = np.concatenate([book.map_to_homo_nid(np.arange(0, 60, 5), "a"), book.map_to_homo_nid([3, 8], "b")])
    input_nodes, output_nodes, blocks = sampler.sample_blocks(g, seeds, rng_seed=2)
    assert blocks[0].etypes.device.type == device
    blocks = [b.to("cpu") for b in blocks]
    check_typed_blocks(graph, book, np.arange(g.num_nodes()), np.arange(g.num_edges()), sampler, blocks)
    sampler.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("structure", ["partitioned", "replicated"])
def test_typed_gpu_sampling_on_a_cluster(served, structure):
    from distgnn.sampling.neighbor import NeighborSampler

    graph, json_path, cluster, orig_nid, orig_eid = served
    g = dist_graph(cluster, json_path, 1)
    try:
        book = g.get_partition_book()
        sampler = NeighborSampler([2, {"r1": 2, "r2": -1, "r3": 1}], device="cuda", structure=structure)
        seeds = book.map_to_homo_nid(np.arange(0, 60, 4), "a")
        _, _, blocks = sampler.sample_blocks(g, seeds, rng_seed=9)
        check_typed_blocks(graph, book, orig_nid, orig_eid, sampler, [b.to("cpu") for b in blocks])
        sampler.close()
    finally:
        g.context.close()
