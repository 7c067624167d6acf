"""RangePartitionBook lookups against brute force, and against a written partition."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from distgnn.data import synthetic
from distgnn.errors import InputError
from distgnn.partition import partition_graph
from distgnn.partition.book import RangePartitionBook
from distgnn.partition.format import load_part_array, read_meta


def _random_ranges(rng: np.random.Generator, num_parts: int, total: int) -> np.ndarray:
    cuts = np.sort(rng.integers(0, total + 1, num_parts - 1))  # empty partitions allowed
    ends = np.append(cuts, total)
    return np.stack([np.concatenate([[0], ends[:-1]]), ends], axis=1)


def _brute_owner(ranges: np.ndarray, ids: np.ndarray) -> np.ndarray:
    inside = (ids[:, None] >= ranges[None, :, 0]) & (ids[:, None] < ranges[None, :, 1])
    assert np.all(inside.sum(1) == 1)
    return inside.argmax(1)


@pytest.mark.parametrize("seed", range(5))
def test_lookups_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    num_parts = int(rng.integers(1, 7))
    node_map = _random_ranges(rng, num_parts, int(rng.integers(1, 500)))
    edge_map = _random_ranges(rng, num_parts, int(rng.integers(1, 2000)))
    book = RangePartitionBook(node_map, edge_map)
    nids = rng.integers(0, node_map[-1, 1], 300)
    eids = rng.integers(0, edge_map[-1, 1], 300)
    assert np.array_equal(book.nid2partid(nids), _brute_owner(node_map, nids))
    assert np.array_equal(book.eid2partid(eids), _brute_owner(edge_map, eids))
    torch_parts = book.nid2partid(torch.from_numpy(nids))
    assert isinstance(torch_parts, torch.Tensor) and torch.equal(
        torch_parts, torch.from_numpy(_brute_owner(node_map, nids))
    )
    for part in range(num_parts):
        owned = np.flatnonzero(_brute_owner(node_map, np.arange(node_map[-1, 1])) == part)
        assert np.array_equal(book.partid2nids(part), owned)
        assert np.array_equal(book.nid2localnid(owned, part), np.arange(owned.size))
        owned_e = np.flatnonzero(_brute_owner(edge_map, np.arange(edge_map[-1, 1])) == part)
        assert np.array_equal(book.partid2eids(part), owned_e)
        assert np.array_equal(book.eid2localeid(owned_e, part), np.arange(owned_e.size))


def test_out_of_range_ids_are_input_errors():
    book = RangePartitionBook([[0, 3], [3, 5]], [[0, 4], [4, 4]])
    with pytest.raises(InputError, match="node id 5"):
        book.nid2partid(np.array([0, 5]))
    with pytest.raises(InputError, match="not owned by partition 1"):
        book.nid2localnid(np.array([1]), 1)
    with pytest.raises(InputError, match="partition id 2"):
        book.partid2nids(2)


def test_book_of_a_written_partition_matches_local2global(tmp_path):
    graph = synthetic(3000, 8, feat_dim=2, num_classes=3, seed=2)
    meta = read_meta(partition_graph(graph, 4, tmp_path / "out"))
    book = meta.partition_book()
    for i in range(meta.num_parts):
        l2g = np.asarray(load_part_array(meta, i, "local2global"))
        owned = meta.parts[i].num_owned_nodes
        assert np.all(book.nid2partid(l2g[:owned]) == i)
        assert np.all(book.nid2partid(l2g[owned:]) != i)
        assert np.array_equal(book.nid2localnid(l2g[:owned], i), np.arange(owned))
