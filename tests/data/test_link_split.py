"""Link splits: held-out pairs leave the training graph in both directions (typed: with their reverse-type
twins), deterministic by seed, and are carried into a partition's new ids."""

from __future__ import annotations

import numpy as np
import pytest

from distgnn.data.graph import Graph
from distgnn.data.link_split import (
    load_held_out,
    load_link_partition,
    save_held_out,
    split_links,
    split_typed_links,
    to_partition_ids,
)
from distgnn.data.synthetic_mag import CITES, REVERSE_ETYPES, WRITES, synthetic_mag
from distgnn.errors import ConfigError, InputError
from distgnn.partition.prepare import partition_link_split

REV_WRITES = REVERSE_ETYPES[WRITES]


def _graph(seed=0, n=200, m=1500) -> Graph:
    rng = np.random.default_rng(seed)
    u, v = rng.integers(0, n, m), rng.integers(0, n, m)
    # Both directions of every pair, some duplicates and self loops, as raw edge lists come.
    src, dst = np.concatenate([u, v, u[:50]]), np.concatenate([v, u, v[:50]])
    return Graph("g", n, src, dst, ndata={"feat": rng.standard_normal((n, 3)).astype(np.float32)})


def _pairs(src, dst, n) -> set[int]:
    return set((np.minimum(src, dst) * n + np.maximum(src, dst)).tolist())


def test_held_out_pairs_leave_the_training_graph_in_both_directions():
    graph = _graph()
    split = split_links(graph, 0.1, 0.2, num_negatives=7, seed=3)
    n = graph.num_nodes
    all_pairs = _pairs(graph.src[graph.src != graph.dst], graph.dst[graph.src != graph.dst], n)
    train_pairs = _pairs(split.train.src, split.train.dst, n)
    val = _pairs(split.val_pairs[:, 0], split.val_pairs[:, 1], n)
    test = _pairs(split.test_pairs[:, 0], split.test_pairs[:, 1], n)
    assert len(val) == int(len(all_pairs) * 0.1) and len(test) == int(len(all_pairs) * 0.2)
    assert train_pairs | val | test == all_pairs
    assert not (train_pairs & val) and not (train_pairs & test) and not (val & test)
    half = split.train.num_edges // 2
    np.testing.assert_array_equal(split.train.src[:half], split.train.dst[half:])
    np.testing.assert_array_equal(split.train.dst[:half], split.train.src[half:])
    reverse = split.train.edata["reverse_eid"]
    np.testing.assert_array_equal(split.train.src[reverse], split.train.dst)
    np.testing.assert_array_equal(split.train.dst[reverse], split.train.src)
    assert split.test_negatives.shape == (len(test), 7) and split.test_negatives.max() < n
    again = split_links(graph, 0.1, 0.2, num_negatives=7, seed=3)
    other = split_links(graph, 0.1, 0.2, num_negatives=7, seed=4)
    np.testing.assert_array_equal(again.test_negatives, split.test_negatives)
    np.testing.assert_array_equal(again.test_pairs, split.test_pairs)
    assert not np.array_equal(other.test_pairs, split.test_pairs)


def test_bad_fractions_are_refused():
    with pytest.raises(InputError, match="fractions"):
        split_links(_graph(), 0.5, 0.5)
    with pytest.raises(InputError, match="num_negatives"):
        split_links(_graph(), 0.1, 0.1, num_negatives=0)


def test_held_out_arrays_round_trip(tmp_path):
    split = split_links(_graph(), 0.1, 0.1, num_negatives=3)
    loaded = load_held_out(save_held_out(split, tmp_path / "h"))
    for name, arr in split.held_out().items():
        np.testing.assert_array_equal(loaded[name], arr)
    with pytest.raises(InputError, match="lacks held-out"):
        load_held_out(tmp_path)


def test_partitioned_split_is_in_new_ids(tmp_path):
    from distgnn.partition.format import load_edge_feature, load_orig_ids, read_meta

    graph = _graph()
    split = split_links(graph, 0.1, 0.1, num_negatives=5, seed=1)
    json_path = partition_link_split(split, 2, tmp_path / "p", "g", method="random")
    held_out = load_link_partition(json_path)
    meta = read_meta(json_path)
    orig_nid, orig_eid = load_orig_ids(meta, mmap=False)
    np.testing.assert_array_equal(orig_nid[held_out["test_pairs"]], split.test_pairs)
    np.testing.assert_array_equal(orig_nid[held_out["val_negatives"]], split.val_negatives)
    reverse = np.concatenate([load_edge_feature(meta, p, "reverse_eid", mmap=False) for p in range(2)])
    new_src = to_partition_ids(orig_nid, split.train.src[orig_eid])
    new_dst = to_partition_ids(orig_nid, split.train.dst[orig_eid])
    np.testing.assert_array_equal(new_src[reverse], new_dst)
    np.testing.assert_array_equal(new_dst[reverse], new_src)
    with pytest.raises(InputError, match="no link split"):
        load_link_partition(tmp_path / "elsewhere" / "g.json")


@pytest.fixture(scope="module")
def mag():
    return synthetic_mag(500, seed=2, feat_dim=4, num_classes=4)


def _edge_set(src, dst) -> set[tuple[int, int]]:
    return set(zip(np.asarray(src).tolist(), np.asarray(dst).tolist(), strict=True))


def test_typed_split_holds_out_target_pairs_and_their_reverse_twins(mag):
    split = split_typed_links(mag, WRITES, REV_WRITES, 0.1, 0.2, num_negatives=6, seed=3)
    offsets = mag.node_offsets()
    pairs = np.concatenate([split.val_pairs, split.test_pairs])
    held = _edge_set(pairs[:, 0] - offsets["author"], pairs[:, 1] - offsets["paper"])
    all_pairs = _edge_set(*mag.edges[WRITES])
    kept = _edge_set(*split.train.edges[WRITES])
    kept_reversed = _edge_set(*split.train.edges[REV_WRITES][::-1])
    assert len(split.val_pairs) == int(len(all_pairs) * 0.1) and len(split.test_pairs) == int(len(all_pairs) * 0.2)
    assert len(held) == len(pairs) and kept | held == all_pairs and not kept & held and not kept_reversed & held
    # Every reverse twin of a kept pair stays; the other edge types are untouched.
    assert kept_reversed == _edge_set(*mag.edges[REV_WRITES][::-1]) - held
    for etype in (CITES, *[e for e in mag.canonical_etypes if e not in (WRITES, REV_WRITES, CITES)]):
        for kept_ids, all_ids in zip(split.train.edges[etype], mag.edges[etype], strict=True):
            np.testing.assert_array_equal(kept_ids, all_ids)
    negs = np.concatenate([split.val_negatives, split.test_negatives])
    assert negs.shape == (len(pairs), 6)
    assert negs.min() >= offsets["paper"] and negs.max() < offsets["paper"] + mag.num_nodes["paper"]
    again = split_typed_links(mag, WRITES, REV_WRITES, 0.1, 0.2, num_negatives=6, seed=3)
    other = split_typed_links(mag, WRITES, REV_WRITES, 0.1, 0.2, num_negatives=6, seed=4)
    for name, arr in split.held_out().items():
        np.testing.assert_array_equal(again.held_out()[name], arr)
    assert not np.array_equal(other.test_pairs, split.test_pairs)


def test_typed_split_without_a_reverse_type_keeps_every_other_edge(mag):
    split = split_typed_links(mag, CITES, None, 0.0, 0.3, num_negatives=2, seed=0)
    assert len(split.val_pairs) == 0 and len(split.test_pairs) == int(len(_edge_set(*mag.edges[CITES])) * 0.3)
    assert split.train.num_edges(CITES) + len(split.test_pairs) <= mag.num_edges(CITES)
    assert split.train.num_edges(REV_WRITES) == mag.num_edges(REV_WRITES)


def test_bad_typed_splits_are_refused(mag):
    with pytest.raises(ConfigError, match="heterogeneous dataset"):
        split_typed_links(_graph(), ("_N", "_E", "_N"))
    with pytest.raises(ConfigError, match="no edge type paper:reads:paper"):
        split_typed_links(mag, ("paper", "reads", "paper"))
    with pytest.raises(ConfigError, match="no edge type paper:wrote:author"):
        split_typed_links(mag, WRITES, ("paper", "wrote", "author"))
    with pytest.raises(ConfigError, match="does not lead back"):
        split_typed_links(mag, WRITES, CITES)
    with pytest.raises(InputError, match="fractions"):
        split_typed_links(mag, WRITES, REV_WRITES, 0.6, 0.4)


def test_partitioned_typed_split_is_in_new_ids(mag, tmp_path):
    from distgnn.partition.format import load_orig_ids, read_meta

    split = split_typed_links(mag, WRITES, REV_WRITES, 0.1, 0.1, num_negatives=3, seed=1)
    json_path = partition_link_split(split, 2, tmp_path / "p", "mag", method="random")
    held_out = load_link_partition(json_path)
    orig_nid, _ = load_orig_ids(read_meta(json_path), mmap=False)
    for name, arr in split.held_out().items():
        np.testing.assert_array_equal(orig_nid[held_out[name]], arr)
