"""Typed partitions: every (partition, type) owns a contiguous range, the CSC holds each edge once in
its type's row, and features and original ids follow their nodes and edges."""

from __future__ import annotations

import numpy as np
import pytest
from hetero_graphs import ETYPES, toy_hetero

from distgnn.data.hetero import ChunkedArray
from distgnn.errors import InputError, PartitionFormatError
from distgnn.partition import check_partition, partition_graph
from distgnn.partition.format import (
    PART_ARRAYS,
    load_edge_feature,
    load_node_feature,
    load_orig_ids,
    load_part_array,
    read_meta,
)


def _materialized(arr) -> np.ndarray:
    return arr.read() if isinstance(arr, ChunkedArray) else np.asarray(arr)


@pytest.mark.parametrize("method", ["metis", "random"])
@pytest.mark.parametrize("num_parts", [1, 3])
def test_typed_partition_round_trips_every_edge_and_feature(tmp_path, method, num_parts):
    g = toy_hetero()
    path = partition_graph(g, num_parts, tmp_path / "out", method=method, balance_train=True, target_ntype="a")
    meta, _ = check_partition(path)
    book = meta.partition_book()
    assert meta.ntypes == ["a", "b", "c"] and meta.canonical_etypes == ETYPES
    offsets = {"a": 0, "b": 60, "c": 100}
    orig_nid, orig_eid = (np.asarray(x) for x in load_orig_ids(meta))
    # Node types survive: the type a new id's range names is the type of its original node.
    new_types, per_type = book.map_to_per_ntype(np.arange(meta.num_nodes))
    orig_types = np.searchsorted([60, 100, 115], orig_nid, side="right")
    assert np.array_equal(new_types, orig_types)
    for ntype in meta.ntypes:
        ids = np.arange(g.num_nodes[ntype])
        assert np.array_equal(book.map_to_per_ntype(book.map_to_homo_nid(ids, ntype))[1], ids)
    # Every edge appears once, in its type's CSC row, with the original endpoints.
    edge_offsets = np.cumsum([0] + [len(g.edges[e][0]) for e in ETYPES])
    seen = np.zeros(meta.num_edges, dtype=int)
    for i in range(num_parts):
        a = {name: np.asarray(load_part_array(meta, i, name)) for name in PART_ARRAYS}
        n0 = meta.node_map[i][0]
        rows = np.repeat(np.arange(len(a["indptr"]) - 1), np.diff(a["indptr"]))
        dst_local, etype = np.divmod(rows, len(ETYPES))
        src = orig_nid[a["local2global"][a["indices"]]]
        dst = orig_nid[dst_local + n0]
        orig = orig_eid[a["eids"]]
        assert np.array_equal(np.searchsorted(edge_offsets[1:], orig, side="right"), etype)
        for k, (s, r, d) in enumerate(ETYPES):
            mine = etype == k
            per = orig[mine] - edge_offsets[k]
            assert np.array_equal(src[mine] - offsets[s], g.edges[(s, r, d)][0][per])
            assert np.array_equal(dst[mine] - offsets[d], g.edges[(s, r, d)][1][per])
        seen[a["eids"]] += 1
    assert np.all(seen == 1)
    # Features of each type in per-type new order come from the original rows.
    for ntype, name in (("a", "feat"), ("a", "label"), ("b", "feat")):
        rows = np.concatenate([np.asarray(load_node_feature(meta, i, f"{ntype}/{name}")) for i in range(num_parts)])
        homo = book.map_to_homo_nid(np.arange(g.num_nodes[ntype]), ntype)
        expect = _materialized(g.ndata[ntype][name])[orig_nid[homo] - offsets[ntype]]
        assert np.array_equal(rows, expect)
    w = np.concatenate([np.asarray(load_edge_feature(meta, i, "a:r1:b/w")) for i in range(num_parts)])
    homo = book.map_to_homo_eid(np.arange(len(w)), ETYPES[0])
    assert np.array_equal(w, _materialized(g.edata[ETYPES[0]]["w"])[orig_eid[homo]])


def test_metis_balances_node_types(tmp_path):
    g = toy_hetero(1)
    meta = read_meta(partition_graph(g, 2, tmp_path / "out", method="metis"))
    sizes = np.diff(np.asarray(meta.node_type_ranges), axis=2)[:, :, 0]  # (P, T)
    totals = sizes.sum(axis=0)
    assert np.all(np.abs(sizes - totals / 2) <= np.maximum(2, 0.2 * totals))


def test_check_names_a_typed_csc_that_mixes_edge_types(tmp_path):
    path = partition_graph(toy_hetero(), 2, tmp_path / "out", method="random")
    meta = read_meta(path)
    indptr_path = meta.root / meta.parts[0].files["indptr"]
    indptr = np.load(indptr_path)
    # Move the boundary between the first two non-empty rows of another type: edges change CSC row.
    nonempty = np.flatnonzero(np.diff(indptr))
    k = nonempty[0] + 1
    indptr[k] = indptr[k - 1] if indptr[k] != indptr[k - 1] else indptr[k + 1]
    np.save(indptr_path, np.maximum.accumulate(indptr))
    with pytest.raises(PartitionFormatError, match="part 0"):
        check_partition(path)


def test_bad_typed_input_is_refused(tmp_path):
    g = toy_hetero()
    with pytest.raises(InputError, match="halo_hops > 1"):
        partition_graph(g, 2, tmp_path / "a", halo_hops=2)
    g.edges[("a", "r1", "zz")] = (np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64))
    with pytest.raises(InputError, match="zz"):
        partition_graph(g, 2, tmp_path / "b")
    assert not (tmp_path / "b").exists()
