"""partition_graph output: every format invariant, checked against the input graph."""

from __future__ import annotations

import numpy as np
import pytest

from distgnn.data import Graph, synthetic
from distgnn.errors import InputError, PartitionFormatError
from distgnn.partition import check_partition, partition_graph
from distgnn.partition.format import (
    PartitionWriter,
    load_edge_feature,
    load_node_feature,
    load_orig_ids,
    load_part_array,
    read_meta,
)


def _random_graph(seed: int, n: int = 300, e: int = 2000) -> Graph:
    """A multigraph with self loops, duplicates and isolated nodes, plus node/edge arrays."""
    rng = np.random.default_rng(seed)
    src = rng.integers(0, n - 10, e)  # the last 10 nodes are isolated
    dst = rng.integers(0, n - 10, e)
    src[:20], dst[:20] = src[0], src[0]  # self loops, duplicated
    ndata = {
        "feat": rng.standard_normal((n, 3)).astype(np.float32),
        "label": rng.integers(0, 4, n),
        "train_mask": rng.random(n) < 0.3,
    }
    edata = {"weight": rng.random(e).astype(np.float32), "orig_id": np.arange(e, dtype=np.int64)}
    return Graph("rand", n, src, dst, ndata=ndata, edata=edata, num_classes=4)


def _in_hop_closure(graph: Graph, owned: np.ndarray, hops: int) -> np.ndarray:
    """Brute force: non-owned nodes within ``hops`` in-hops of the owned set (original ids)."""
    reached = np.zeros(graph.num_nodes, dtype=bool)
    reached[owned] = True
    frontier = reached.copy()
    for _ in range(hops):
        step = np.zeros(graph.num_nodes, dtype=bool)
        step[graph.src[frontier[graph.dst]]] = True
        frontier = step & ~reached
        reached |= step
    reached[owned] = False
    return np.flatnonzero(reached)


@pytest.mark.parametrize("method", ["metis", "random"])
@pytest.mark.parametrize("num_parts", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("halo_hops", [1, 2])
def test_partition_reproduces_the_input_graph(tmp_path, method, num_parts, halo_hops):
    graph = _random_graph(seed=num_parts * 10 + halo_hops)
    json_path = partition_graph(graph, num_parts, tmp_path / "out", method=method, halo_hops=halo_hops, seed=1)
    meta, summaries = check_partition(json_path)
    assert (meta.num_nodes, meta.num_edges, meta.num_parts) == (graph.num_nodes, graph.num_edges, num_parts)
    orig_nid, orig_eid = (np.asarray(a) for a in load_orig_ids(meta))
    book = meta.partition_book()

    seen_edges = []
    for i in range(num_parts):
        n0, n1 = meta.node_map[i]
        indptr = load_part_array(meta, i, "indptr")
        indices = load_part_array(meta, i, "indices")
        eids = load_part_array(meta, i, "eids")
        l2g = load_part_array(meta, i, "local2global")
        # Edges belong to their destination's partition: destinations are the owned nodes.
        dst_new = n0 + np.repeat(np.arange(n1 - n0), np.diff(indptr))
        src_new = l2g[indices]
        assert np.all(book.nid2partid(dst_new) == i)
        assert np.array_equal(book.eid2partid(eids), np.full(len(eids), i))
        # Per-edge identity: stored edge k is input edge orig_eid[eids[k]] with the same endpoints.
        orig_e = orig_eid[eids]
        assert np.array_equal(graph.src[orig_e], orig_nid[src_new])
        assert np.array_equal(graph.dst[orig_e], orig_nid[dst_new])
        seen_edges.append(orig_e)
        # Features: owned rows in new-id order, owned edges in new-edge-id order.
        for name, arr in graph.ndata.items():
            assert np.array_equal(load_node_feature(meta, i, name), arr[orig_nid[n0:n1]])
        for name, arr in graph.edata.items():
            assert np.array_equal(load_edge_feature(meta, i, name), arr[orig_e])
        # HALO nodes: exactly the non-owned nodes within halo_hops in-hops.
        halo = np.sort(orig_nid[l2g[n1 - n0 :]])
        assert np.array_equal(halo, _in_hop_closure(graph, orig_nid[n0:n1], halo_hops))
        assert summaries[i].cut_edges == int(np.count_nonzero(indices >= n1 - n0))
        assert summaries[i].train_nodes == int(graph.ndata["train_mask"][orig_nid[n0:n1]].sum())
    assert np.array_equal(np.sort(np.concatenate(seen_edges)), np.arange(graph.num_edges))
    assert meta.extra["num_classes"] == 4


def test_metis_cuts_fewer_edges_than_random(tmp_path):
    graph = synthetic(4000, 10, feat_dim=4, num_classes=4, seed=0)
    cuts = {}
    for method in ("metis", "random"):
        _, rows = check_partition(partition_graph(graph, 4, tmp_path / method, method=method))
        cuts[method] = sum(r.cut_edges for r in rows)
        assert max(r.owned_nodes for r in rows) <= 1.1 * graph.num_nodes / 4
    assert cuts["metis"] < 0.7 * cuts["random"]


def _two_cliques_graph(n: int = 400) -> Graph:
    """Two dense halves joined by a few edges; train nodes all in the first half."""
    rng = np.random.default_rng(0)
    half = n // 2
    a = rng.integers(0, half, (4000, 2))
    b = rng.integers(half, n, (4000, 2))
    bridge = np.stack([rng.integers(0, half, 20), rng.integers(half, n, 20)], axis=1)
    pairs = np.concatenate([a, b, bridge])
    src = np.concatenate([pairs[:, 0], pairs[:, 1]])
    dst = np.concatenate([pairs[:, 1], pairs[:, 0]])
    train = np.zeros(n, dtype=bool)
    train[: half // 2] = True
    return Graph("cliques", n, src, dst, ndata={"train_mask": train})


def test_balance_train_spreads_train_nodes(tmp_path):
    graph = _two_cliques_graph()
    _, plain = check_partition(partition_graph(graph, 2, tmp_path / "plain"))
    _, balanced = check_partition(partition_graph(graph, 2, tmp_path / "bal", balance_train=True))
    total = int(graph.ndata["train_mask"].sum())
    assert max(r.train_nodes for r in plain) == total  # METIS alone follows the cliques
    assert max(r.train_nodes for r in balanced) <= 0.6 * total


def test_balance_edges_evens_out_in_edges(tmp_path):
    # A dense community (300 nodes) and a sparse one (600 nodes): node-count balance
    # puts the dense one in one partition; in-degree weights must split it.
    rng = np.random.default_rng(1)
    dense = rng.integers(0, 300, (4500, 2))
    sparse = rng.integers(300, 900, (900, 2))
    pairs = np.concatenate([dense, sparse, [[0, 300]]])
    graph = Graph(
        "lopsided", 900, np.concatenate([pairs[:, 0], pairs[:, 1]]), np.concatenate([pairs[:, 1], pairs[:, 0]])
    )
    _, plain = check_partition(partition_graph(graph, 2, tmp_path / "plain"))
    _, balanced = check_partition(partition_graph(graph, 2, tmp_path / "bal", balance_edges=True))
    assert max(r.edges for r in plain) > 1.3 * graph.num_edges / 2
    assert max(r.edges for r in balanced) <= 1.1 * graph.num_edges / 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_parts": 0}, "num_parts must be between 1"),
        ({"num_parts": 301}, "num_parts must be between 1"),
        ({"method": "spectral"}, "unknown partition method"),
        ({"halo_hops": 0}, "halo_hops must be >= 1"),
        ({"graph_name": "../escape"}, "graph name"),
    ],
)
def test_partition_graph_rejects_bad_arguments(tmp_path, kwargs, message):
    graph = _random_graph(0)
    args = {"num_parts": 2, **kwargs}
    with pytest.raises(InputError, match=message):
        partition_graph(graph, out_dir=tmp_path / "out", **args)
    assert not (tmp_path / "out").exists()


def test_interrupted_write_leaves_nothing(tmp_path, monkeypatch):
    graph = _random_graph(0)
    out = tmp_path / "out"
    real_save = PartitionWriter.save
    calls = []

    def failing_save(self, rel, array):
        calls.append(rel)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real_save(self, rel, array)

    monkeypatch.setattr(PartitionWriter, "save", failing_save)
    with pytest.raises(KeyboardInterrupt):
        partition_graph(graph, 2, out)
    assert len(calls) == 5
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_interrupted_overwrite_keeps_the_old_partition(tmp_path, monkeypatch):
    graph = _random_graph(0)
    out = tmp_path / "out"
    json_path = partition_graph(graph, 2, out, graph_name="g")
    before = read_meta(json_path)

    def failing_save(self, rel, array):
        raise RuntimeError("disk full")

    monkeypatch.setattr(PartitionWriter, "save", failing_save)
    with pytest.raises(RuntimeError, match="disk full"):
        partition_graph(graph, 3, out, graph_name="g", overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert read_meta(json_path).num_parts == before.num_parts == 2
    check_partition(json_path)


def test_output_dir_of_another_graph_is_refused(tmp_path):
    graph = _random_graph(0)
    partition_graph(graph, 2, tmp_path / "out", graph_name="a")
    with pytest.raises(PartitionFormatError, match="does not hold a partition of 'b'"):
        partition_graph(graph, 2, tmp_path / "out", graph_name="b", overwrite=True)
    with pytest.raises(PartitionFormatError, match="pass --overwrite"):
        partition_graph(graph, 2, tmp_path / "out", graph_name="a")
    assert read_meta(partition_graph(graph, 3, tmp_path / "out", graph_name="a", overwrite=True)).num_parts == 3
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no staging or old copy left beside it
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "a.json",
        "orig_eid.npy",
        "orig_nid.npy",
        "part0",
        "part1",
        "part2",
    ]


@pytest.mark.parametrize(
    ("victim", "corrupt", "message"),
    [
        ("indices", lambda a: a + 10_000, "indices must be local ids"),
        ("eids", lambda a: a[::-1], "eids must be"),
        ("indptr", lambda a: a[:-1], "indptr must be"),
        ("local2global", lambda a: np.concatenate([a[:-1], a[:1]]), "HALO nodes must be distinct"),
    ],
)
def test_check_catches_corruption(tmp_path, victim, corrupt, message):
    json_path = partition_graph(_random_graph(0), 2, tmp_path / "out")
    meta = read_meta(json_path)
    path = meta.root / meta.parts[1].files[victim]
    np.save(path, corrupt(np.load(path)))
    with pytest.raises(PartitionFormatError, match=message):
        check_partition(json_path)


def test_check_catches_bad_orig_ids_and_feature_rows(tmp_path):
    json_path = partition_graph(_random_graph(0), 2, tmp_path / "out")
    meta = read_meta(json_path)
    feat = meta.root / meta.parts[0].node_feats["feat"]
    good = np.load(feat)
    np.save(feat, good[:-1])
    with pytest.raises(PartitionFormatError, match="node feature 'feat'"):
        check_partition(json_path)
    np.save(feat, good)
    orig = meta.root / meta.orig_nid
    ids = np.load(orig)
    ids[0] = ids[1]
    np.save(orig, ids)
    with pytest.raises(PartitionFormatError, match="orig_nid is not a permutation"):
        check_partition(json_path)


@pytest.mark.parametrize("key_bound", [1, 7, 1000, 1 << 61])
def teststable_order_matches_stable_argsort(key_bound):
    from distgnn.partition.reshuffle import stable_order

    keys = np.random.default_rng(key_bound % 97).integers(0, min(key_bound, 1 << 40), 5000)
    expected = np.argsort(keys, kind="stable")
    assert np.array_equal(stable_order(keys.copy(), key_bound), expected)
