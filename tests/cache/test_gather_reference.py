"""The gather's torch reference path and its planner, against a plain full-table oracle (CPU, runs in CI)."""

from __future__ import annotations

import pytest
import torch

from distgnn.cache import FeatureCache, HostTier, StagingTier, gather, remote_misses
from distgnn.cache.gather import key_space, plan_gather
from distgnn.errors import InputError

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def random_setup(seed: int, *, num_nodes=500, width=7, dtype=torch.float32, cached=0.2, shards=1, batch=300):
    """A random table split over cache / host / staging tiers, and random ids (unsorted, with repeats)."""
    gen = torch.Generator().manual_seed(seed)
    table = torch.randn(num_nodes, width, generator=gen).to(dtype)
    perm = torch.randperm(num_nodes, generator=gen)
    hot = perm[: int(cached * num_nodes)]
    cache = FeatureCache.clique(hot, table[hot], num_nodes, ["cpu"] * shards)[0] if hot.numel() else None
    start = int(torch.randint(0, num_nodes // 2, (1,), generator=gen))
    end = start + int(torch.randint(1, num_nodes // 2, (1,), generator=gen))
    host = HostTier(table[start:end].clone(), start)
    ids = torch.randint(0, num_nodes, (batch,), generator=gen)
    ids = torch.cat([ids, ids[: batch // 3]])[torch.randperm(batch + batch // 3, generator=gen)]
    needed = remote_misses(ids, cache=cache, host=host)
    extra = torch.randint(0, num_nodes, (20,), generator=gen)  # staging may hold rows nobody asked for
    staged = torch.unique(torch.cat([needed, extra]))
    staging = StagingTier(staged, table[staged].clone())
    return table, ids, cache, host, staging


def poisoned(rows: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.full((rows, width), float("nan"), dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [1, 3, 17, 64])
@pytest.mark.parametrize("shards", [1, 3])
def test_reference_matches_full_table_over_all_tiers(dtype, width, shards):
    for seed in range(3):
        table, ids, cache, host, staging = random_setup(seed, width=width, dtype=dtype, shards=shards)
        out = gather(poisoned(len(ids), width, dtype), ids, cache=cache, host=host, staging=staging, impl="torch")
        assert torch.equal(out, table[ids])


@pytest.mark.parametrize("tiers", ["cache", "host", "staging", "cache+host", "cache+staging", "host+staging"])
def test_reference_with_tier_subsets(tiers):
    table, _, cache, host, _ = random_setup(1, cached=0.3)
    ids = torch.randint(0, 500, (200,))
    cache = cache if "cache" in tiers else None
    host = host if "host" in tiers else None
    if "staging" in tiers:
        staged = remote_misses(ids, cache=cache, host=host)
        staging = StagingTier(staged, table[staged].clone())
    else:
        keep = torch.zeros_like(ids, dtype=torch.bool)
        if cache is not None:
            keep |= cache.slot_table[ids] >= 0
        if host is not None:
            keep |= (ids >= host.start) & (ids < host.end)
        ids, staging = ids[keep], None
    out = gather(poisoned(len(ids), 7, torch.float32), ids, cache=cache, host=host, staging=staging, impl="torch")
    assert torch.equal(out, table[ids])


def test_cache_takes_precedence_over_host_and_staging():
    table = torch.randn(50, 4)
    ids = torch.arange(50)
    cache = FeatureCache.replicate(torch.tensor([3, 7]), table[[3, 7]] + 100, 50, "cpu")
    staging = StagingTier(torch.tensor([3, 7]), table[[3, 7]] - 100)
    out = gather(torch.empty(50, 4), ids, cache=cache, host=HostTier(table.clone(), 0), staging=staging)
    expected = table.clone()
    expected[[3, 7]] += 100
    assert torch.equal(out, expected)


def test_empty_batch_returns_empty_output():
    _, _, cache, host, staging = random_setup(2)
    out = gather(torch.empty(0, 7), torch.empty(0, dtype=torch.int64), cache=cache, host=host, staging=staging)
    assert out.shape == (0, 7)
    assert cache.stats.lookups == 0


def test_int32_ids_are_accepted():
    table, ids, cache, host, staging = random_setup(3)
    out = gather(poisoned(len(ids), 7, torch.float32), ids.int(), cache=cache, host=host, staging=staging)
    assert torch.equal(out, table[ids])


def test_hit_counters_split_local_and_peer_hits():
    num_nodes, shards = 400, 4
    table = torch.randn(num_nodes, 5)
    hot = torch.randperm(num_nodes)[:100]
    views = FeatureCache.clique(hot, table[hot], num_nodes, ["cpu"] * shards)
    ids = torch.randint(0, num_nodes, (1000,))
    staging = StagingTier(torch.arange(num_nodes), table.clone())
    for view in views:
        gather(torch.empty(len(ids), 5), ids, cache=view, staging=staging)
        slots = view.slot_table[ids]
        hit = slots >= 0
        assert view.stats.lookups == len(ids)
        assert view.stats.hits == int(hit.sum())
        assert view.stats.local_hits == int((hit & (slots % shards == view.local_rank)).sum())
        assert view.stats.hit_rate() == pytest.approx(float(hit.float().mean()))
    view.stats.reset()
    assert view.stats.lookups == view.stats.hits == 0


def test_missing_id_raises_input_error():
    table = torch.randn(20, 3)
    host = HostTier(table[:10].clone(), 0)
    with pytest.raises(InputError, match="in no tier"):
        gather(torch.empty(3, 3), torch.tensor([1, 15, 2]), host=host)


@pytest.mark.parametrize(
    ("out", "ids", "match"),
    [
        (torch.empty(3, 4), torch.tensor([0, 1]), "one row per id"),
        (torch.empty(2, 4, dtype=torch.float64), torch.tensor([0, 1]), "float32, float16 or bfloat16"),
        (torch.empty(2, 4), torch.tensor([0.0, 1.0]), "integer"),
        (torch.empty(2, 4), torch.tensor([0, -1]), ">= 0"),
        (torch.empty(2, 5), torch.tensor([0, 1]), "width"),
        (torch.empty(4, 2).t(), torch.tensor([0, 1]), "contiguous"),
    ],
)
def test_bad_inputs_raise_input_error(out, ids, match):
    with pytest.raises(InputError, match=match):
        gather(out, ids, host=HostTier(torch.randn(10, 4), 0))


@pytest.mark.parametrize("share", [-0.1, 1.5, float("nan")])
def test_cpu_share_outside_zero_to_one_is_refused(share):
    with pytest.raises(InputError, match="cpu_share"):
        gather(torch.empty(2, 4), torch.tensor([0, 1]), host=HostTier(torch.randn(10, 4), 0), cpu_share=share)


def test_reference_path_gives_the_same_rows_whatever_the_cpu_share():
    table, ids, cache, host, staging = random_setup(11)
    for share in (0.0, 0.5, 1.0):
        out = gather(poisoned(len(ids), 7, table.dtype), ids, cache=cache, host=host, staging=staging, cpu_share=share)
        assert torch.equal(out, table[ids])


def test_ids_beyond_slot_table_raise():
    cache = FeatureCache.replicate(torch.tensor([1]), torch.randn(1, 2), 10, "cpu")
    with pytest.raises(InputError, match="slot table"):
        gather(torch.empty(1, 2), torch.tensor([10]), cache=cache, host=HostTier(torch.randn(20, 2), 0))


def test_staging_ids_must_be_sorted_unique():
    with pytest.raises(InputError, match="strictly increasing"):
        StagingTier(torch.tensor([3, 3]), torch.randn(2, 4))
    with pytest.raises(InputError, match="must match"):
        StagingTier(torch.tensor([1, 3]), torch.randn(3, 4))


def test_remote_misses_are_sorted_unique_and_exclude_cache_and_host():
    _, ids, cache, host, _ = random_setup(4)
    misses = remote_misses(ids, cache=cache, host=host)
    expected = sorted({i for i in ids.tolist() if cache.slot_table[i] < 0 and not host.start <= i < host.end})
    assert misses.tolist() == expected


def execute_plan(plan, out, cache, host, staging):
    """What the CUDA kernel does with a plan, in plain Python (the kernel's own reference); returns keys read."""
    keys, order = plan.keys.tolist(), plan.order.tolist()
    staged = {} if staging is None else {i: row for i, row in zip(staging.ids.tolist(), staging.rows, strict=True)}
    reads = []
    for i, key in enumerate(keys):
        if key == plan.bad_key or (plan.deduplicate and i > 0 and keys[i - 1] == key):
            continue
        run = 1
        while plan.deduplicate and i + run < len(keys) and keys[i + run] == key:
            run += 1
        if key >= plan.hit_base:
            slot = key - plan.hit_base
            row = cache.shards[slot % cache.num_shards][slot // cache.num_shards]
        elif host is not None and host.start <= key < host.end:
            row = host.rows[key - host.start]
        elif key in staged:
            row = staged[key]
        else:
            continue
        reads.append(key)
        for d in order[i : i + run]:
            out[d] = row
    return reads


@pytest.mark.parametrize("sort_misses", [True, False])
@pytest.mark.parametrize("shards", [1, 2])
def test_plan_executed_like_the_kernel_matches_full_table(sort_misses, shards):
    for seed in range(3):
        table, ids, cache, host, staging = random_setup(seed, shards=shards)
        plan = plan_gather(ids, cache, key_space(cache, host, staging), sort_misses=sort_misses)
        out = poisoned(len(ids), 7, torch.float32)
        reads = execute_plan(plan, out, cache, host, staging)
        assert torch.equal(out, table[ids])
        assert sorted(plan.order.tolist()) == list(range(len(ids)))
        slots = cache.slot_table[ids].long()
        wanted = torch.where(slots >= 0, plan.hit_base + slots, ids)
        if sort_misses:  # misses first and ascending, then hits by slot; every row is read once, in order
            assert bool((plan.keys[1:] >= plan.keys[:-1]).all())
            assert reads == torch.unique(wanted).tolist()
        else:
            assert sorted(reads) == sorted(wanted.tolist())


def test_plan_keys_misses_then_hits_by_slot_then_unkeyable_ids():
    cache = FeatureCache.replicate(torch.tensor([2, 3]), torch.randn(2, 3), 5, "cpu")
    hit_base, bad_key = key_space(cache, None, None)
    assert (hit_base, bad_key) == (5, 7)
    plan = plan_gather(torch.tensor([3, 4, 6, 2, 9, -1, 2]), cache, (hit_base, bad_key))
    assert plan.keys.tolist() == [4, 5, 5, 6, 7, 7, 7]
    assert plan.order.tolist() == [1, 3, 6, 0, 2, 4, 5]


def test_key_space_covers_every_tier_and_slot():
    host = HostTier(torch.randn(10, 2), 100)
    staging = StagingTier(torch.tensor([3, 300]), torch.randn(2, 2))
    cache = FeatureCache.replicate(torch.arange(200), torch.randn(200, 2), 400, "cpu")
    assert key_space(None, host, None) == (110, 127)
    assert key_space(None, host, staging) == (301, 511)
    assert key_space(cache, host, staging) == (400, 1023)
    assert key_space(None, None, None) == (0, 1)


def _share_range_model(keys: list[int], start: int, end: int, share: float) -> tuple[int, int]:
    """The CPU share's items, by a plain scan: the first round(share * n) of the n keys in [start, end), then
    up to the end of that last key's run."""
    inside = [i for i, k in enumerate(keys) if start <= k < end]
    if not inside:
        first = next((i for i, k in enumerate(keys) if k >= start), len(keys))
        return first, first
    take = round(share * len(inside))
    if take == 0:
        return inside[0], inside[0]
    last = inside[0] + take - 1
    stop = last + 1
    while stop < len(keys) and keys[stop] == keys[last]:
        stop += 1
    return inside[0], stop


@pytest.mark.parametrize("seed", range(20))
def test_cpu_share_range_takes_the_first_share_of_the_host_misses_whole_runs(seed):
    from distgnn.cache.gather import cpu_share_range

    gen = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 400, (1,), generator=gen))
    keys = torch.sort(torch.randint(0, 120, (n,), generator=gen)).values  # sorted, with runs of equal keys
    start = int(torch.randint(0, 100, (1,), generator=gen))
    rows = int(torch.randint(1, 60, (1,), generator=gen))
    host = HostTier(torch.zeros(rows, 4), start)
    for share in (0.0001, 0.3, 0.5, 1.0, float(torch.rand(1, generator=gen))):
        got = tuple(cpu_share_range(keys, host, share).tolist())
        assert got == _share_range_model(keys.tolist(), start, start + rows, share), (share, start, rows)
