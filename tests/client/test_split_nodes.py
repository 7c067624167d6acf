"""node_split: equal, disjoint, mostly local shares of a mask's nodes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from distgnn.client.split import node_split
from distgnn.errors import InputError
from distgnn.partition.book import RangePartitionBook


def _book(sizes):
    ends = np.cumsum(sizes)
    node_map = np.stack([ends - sizes, ends], 1)
    return RangePartitionBook(node_map, node_map)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 6])
def test_force_even_gives_equal_disjoint_shares_of_the_mask(world_size):
    rng = np.random.default_rng(world_size)
    book = _book(np.array([400, 350, 450]))
    mask = rng.random(book.num_nodes) < 0.3
    shares = [node_split(torch.from_numpy(mask), book, rank=r, world_size=world_size) for r in range(world_size)]
    selected = np.flatnonzero(mask)
    assert {len(s) for s in shares} == {len(selected) // world_size}
    union = np.concatenate([s.numpy() for s in shares])
    assert len(np.unique(union)) == len(union) and np.isin(union, selected).all()
    assert len(selected) - len(union) < world_size
    assert all(s.dtype == torch.int64 and bool((s[1:] > s[:-1]).all()) for s in shares)


def test_force_even_shares_are_mostly_local_with_balanced_partitions():
    book = _book(np.array([500, 500]))
    rng = np.random.default_rng(0)
    mask = np.zeros(1000, bool)
    mask[rng.choice(500, 100, replace=False)] = True
    mask[500 + rng.choice(500, 110, replace=False)] = True
    for rank in range(4):  # two trainers per machine
        share = node_split(mask, book, rank=rank, world_size=4).numpy()
        local = book.nid2partid(share) == rank // 2
        assert local.mean() >= 0.9


def test_without_force_even_each_machine_splits_its_own_nodes():
    book = _book(np.array([300, 200]))
    mask = np.random.default_rng(1).random(500) < 0.5
    shares = [node_split(mask, book, force_even=False, rank=r, world_size=4).numpy() for r in range(4)]
    for rank, share in enumerate(shares):
        assert (book.nid2partid(share) == rank // 2).all()
    np.testing.assert_array_equal(np.sort(np.concatenate(shares)), np.flatnonzero(mask))


def test_bad_arguments_are_refused():
    book = _book(np.array([10, 10]))
    with pytest.raises(InputError, match="rank"):
        node_split(np.ones(20, bool), book, rank=2, world_size=2)
    with pytest.raises(InputError, match="one entry per node"):
        node_split(np.ones(19, bool), book, rank=0, world_size=2)
    with pytest.raises(InputError, match="trainer count"):
        node_split(np.ones(20, bool), book, force_even=False, rank=0, world_size=3)
