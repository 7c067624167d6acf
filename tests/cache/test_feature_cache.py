"""FeatureCache construction: replicate and clique layouts, slot tables, validation."""

from __future__ import annotations

import pytest
import torch

from distgnn.cache import FeatureCache
from distgnn.errors import InputError


@pytest.mark.parametrize("num_shards", [1, 2, 5])
def test_clique_places_slot_k_on_shard_k_mod_g(num_shards):
    num_nodes = 200
    table = torch.randn(num_nodes, 6)
    hot = torch.randperm(num_nodes)[:77]
    views = FeatureCache.clique(hot, table[hot], num_nodes, ["cpu"] * num_shards)
    assert [view.local_rank for view in views] == list(range(num_shards))
    for view in views:
        assert view.policy == ("replicate" if num_shards == 1 else "clique")
        assert view.capacity == 77
        assert all(mine is first for mine, first in zip(view.shards, views[0].shards, strict=True))
        slots = view.slot_table
        assert int((slots >= 0).sum()) == 77
        for k, node in enumerate(hot.tolist()):
            slot = int(slots[node])
            assert slot == k
            assert torch.equal(view.shards[slot % num_shards][slot // num_shards], table[node])
    assert [shard.shape[0] for shard in views[0].shards] == [len(range(g, 77, num_shards)) for g in range(num_shards)]


def test_replicate_holds_everything_in_one_shard():
    table = torch.randn(30, 3, dtype=torch.bfloat16)
    cache = FeatureCache.replicate(torch.tensor([4, 2, 9]), table[[4, 2, 9]], 30, "cpu")
    assert cache.num_shards == 1 and cache.num_nodes == 30 and cache.dtype == torch.bfloat16
    assert cache.slot_table.dtype == torch.int32
    assert cache.slot_table[[4, 2, 9, 0]].tolist() == [0, 1, 2, -1]
    assert torch.equal(cache.shards[0], table[[4, 2, 9]])


@pytest.mark.parametrize(
    ("hot", "rows", "match"),
    [
        (torch.tensor([1, 1]), torch.randn(2, 3), "repeat"),
        (torch.tensor([1, 30]), torch.randn(2, 3), r"\[0, 30\)"),
        (torch.tensor([1, 2]), torch.randn(3, 3), "one id per row"),
        (torch.tensor([1]), torch.randn(1, 3).double(), "float32"),
    ],
)
def test_bad_hot_sets_raise(hot, rows, match):
    with pytest.raises(InputError, match=match):
        FeatureCache.replicate(hot, rows, 30, "cpu")


def test_shards_must_agree_and_fit_the_kernel():
    table = torch.full((10,), -1, dtype=torch.int32)
    with pytest.raises(InputError, match="differ"):
        FeatureCache([torch.randn(2, 3), torch.randn(2, 4)], table)
    with pytest.raises(InputError, match="1 to 16"):
        FeatureCache([torch.randn(1, 3)] * 17, table)
    with pytest.raises(InputError, match="local_rank"):
        FeatureCache([torch.randn(1, 3)], table, local_rank=1)


@pytest.mark.parametrize(("cached", "covers"), [(30, True), (29, False), (0, False)])
def test_covers_all_when_every_node_has_a_slot(cached, covers):
    hot = torch.randperm(30)[:cached]
    cache = FeatureCache.clique(hot, torch.randn(cached, 3), 30, ["cpu", "cpu"])[0]
    assert cache.covers_all is covers


def test_stats_counter_accumulates_in_place():
    cache = FeatureCache.replicate(torch.arange(4), torch.randn(4, 2), 4, "cpu")
    counter = cache.stats.counter(torch.device("cpu"))
    cache.stats.record(5, torch.tensor([3, 1]))
    counter += torch.tensor([2, 0])  # what a kernel does
    assert (cache.stats.lookups, cache.stats.local_hits, cache.stats.peer_hits) == (5, 5, 1)
    cache.stats.reset()
    assert (cache.stats.lookups, cache.stats.hits) == (0, 0)
