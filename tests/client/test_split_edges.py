"""edge_split: equal, disjoint shares of a mask's edges, each trainer's own machine's edges first."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from distgnn.client.split import edge_split
from distgnn.errors import InputError
from distgnn.partition.book import RangePartitionBook


def _book(edge_sizes):
    ends = np.cumsum(edge_sizes)
    edge_map = np.stack([ends - edge_sizes, ends], 1)
    node_map = np.stack([np.arange(len(ends)) * 10, np.arange(1, len(ends) + 1) * 10], 1)
    return RangePartitionBook(node_map, edge_map)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 6])
def test_force_even_gives_equal_disjoint_shares_of_the_mask(world_size):
    rng = np.random.default_rng(world_size)
    book = _book(np.array([400, 350, 450]))
    mask = rng.random(book.num_edges) < 0.3
    shares = [edge_split(torch.from_numpy(mask), book, rank=r, world_size=world_size) for r in range(world_size)]
    selected = np.flatnonzero(mask)
    assert {len(s) for s in shares} == {len(selected) // world_size}
    union = np.concatenate([s.numpy() for s in shares])
    assert len(np.unique(union)) == len(union) and np.isin(union, selected).all()
    assert len(selected) - len(union) < world_size
    assert all(s.dtype == torch.int64 and bool((s[1:] > s[:-1]).all()) for s in shares)


def test_force_even_takes_the_own_machines_edges_first():
    # Machine 0 owns far more selected edges than machine 1: consecutive chunks of the sorted ids
    # would give both of machine 1's trainers edges of machine 0.
    book = _book(np.array([700, 300]))
    mask = np.ones(1000, bool)
    shares = [edge_split(mask, book, rank=r, world_size=4).numpy() for r in range(4)]
    local = [(book.eid2partid(s) == r // 2).sum() for r, s in enumerate(shares)]
    # Machine 1's 300 edges all go to its trainers (150 each), the rest of their shares from machine 0.
    assert local == [250, 250, 150, 150]
    union = np.concatenate(shares)
    assert len(np.unique(union)) == 1000


def test_without_force_even_each_machine_splits_its_own_edges():
    book = _book(np.array([300, 200]))
    mask = np.random.default_rng(1).random(500) < 0.5
    shares = [edge_split(mask, book, force_even=False, rank=r, world_size=4).numpy() for r in range(4)]
    for rank, share in enumerate(shares):
        assert (book.eid2partid(share) == rank // 2).all()
    np.testing.assert_array_equal(np.sort(np.concatenate(shares)), np.flatnonzero(mask))


def test_bad_arguments_are_refused():
    book = _book(np.array([10, 10]))
    with pytest.raises(InputError, match="rank"):
        edge_split(np.ones(20, bool), book, rank=2, world_size=2)
    with pytest.raises(InputError, match="one entry per edge"):
        edge_split(np.ones(19, bool), book, rank=0, world_size=2)


@pytest.mark.parametrize("world_size", [2, 4])
def test_edges_of_one_type_are_shared_out_as_their_homogeneous_ids(tmp_path, world_size):
    from hetero_graphs import ETYPES, toy_hetero

    from distgnn.partition import partition_graph
    from distgnn.partition.format import read_meta

    book = read_meta(partition_graph(toy_hetero(5), 2, tmp_path / "p", graph_name="g")).partition_book()
    etype = ETYPES[0]
    count = int(book.edges.type_counts[book.etype_id(etype)])
    mask = np.random.default_rng(world_size).random(count) < 0.7
    # The same edges picked by a homogeneous mask over the type's id ranges.
    homo_mask = np.zeros(book.num_edges, dtype=bool)
    homo_mask[book.map_to_homo_eid(np.flatnonzero(mask), etype)] = True
    for rank in range(world_size):
        got = edge_split(mask, book, rank=rank, world_size=world_size, etype=etype)
        homo = edge_split(homo_mask, book, rank=rank, world_size=world_size)
        np.testing.assert_array_equal(got.numpy(), book.map_to_per_etype(homo.numpy())[1])
        assert mask[got.numpy()].all() and (np.diff(got.numpy()) > 0).all()
    with pytest.raises(InputError, match="one entry per edge of type"):
        edge_split(np.ones(count + 1, bool), book, rank=0, world_size=2, etype=etype)
