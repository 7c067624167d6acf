"""The CUDA gather kernel against the torch reference and a full-table oracle (skips without a GPU)."""

from __future__ import annotations

import importlib
import os
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

from distgnn.cache import FeatureCache, HostRegistration, HostTier, StagingTier, gather, remote_misses
from distgnn.cache.gather import key_space, plan_gather, plan_gather_cuda
from distgnn.errors import InputError

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def pinned_rows(rows: torch.Tensor, offset_elems: int = 0) -> torch.Tensor:
    """A pinned copy of ``rows``, optionally starting ``offset_elems`` elements into its buffer (misaligned)."""
    buf = torch.empty(rows.numel() + offset_elems, dtype=rows.dtype, pin_memory=True)
    view = buf[offset_elems:].view(rows.shape)
    view.copy_(rows)
    return view


def cuda_setup(seed, *, num_nodes=5000, width=7, dtype=torch.float32, cached=0.2, shards=1, batch=3000, offset=0):
    gen = torch.Generator().manual_seed(seed)
    table = torch.randn(num_nodes, width, generator=gen).to(dtype)
    hot = torch.randperm(num_nodes, generator=gen)[: int(cached * num_nodes)]
    devices = [f"cuda:{g % torch.cuda.device_count()}" for g in range(shards)]
    cache = FeatureCache.clique(hot, table[hot], num_nodes, devices)[0] if hot.numel() else None
    start = int(torch.randint(0, num_nodes // 2, (1,), generator=gen))
    end = start + int(torch.randint(1, num_nodes // 2, (1,), generator=gen))
    host = HostTier(pinned_rows(table[start:end], offset), start)
    ids = torch.randint(0, num_nodes, (batch,), generator=gen)
    ids = torch.cat([ids, ids[: batch // 3]])[torch.randperm(batch + batch // 3, generator=gen)].cuda()
    staged = remote_misses(ids, cache=cache, host=host).cpu()
    staging = StagingTier(staged, pinned_rows(table[staged]))
    return table, ids, cache, host, staging


def poisoned(rows: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.full((rows, width), float("nan"), dtype=dtype, device="cuda")


def check_kernel(table, ids, cache, host, staging, **kwargs):
    expected = table[ids.cpu()].cuda()
    out = gather(
        poisoned(len(ids), table.shape[1], table.dtype),
        ids,
        cache=cache,
        host=host,
        staging=staging,
        impl="cuda",
        **kwargs,
    )
    torch.cuda.synchronize()
    ref = gather(
        poisoned(len(ids), table.shape[1], table.dtype), ids, cache=cache, host=host, staging=staging, impl="torch"
    )
    assert torch.equal(out, expected)
    assert torch.equal(ref, expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [1, 3, 4, 8, 17, 64, 100, 129, 256])
def test_kernel_matches_reference_over_all_tiers(dtype, width):
    for seed in range(2):
        check_kernel(*cuda_setup(seed, width=width, dtype=dtype))


@pytest.mark.parametrize("offset", [1, 2, 3])
@pytest.mark.parametrize("width", [8, 64])
def test_misaligned_host_rows_fall_back_to_narrow_loads(offset, width):
    check_kernel(*cuda_setup(7, width=width, dtype=torch.float16, offset=offset))


@pytest.mark.parametrize("shards", [2, 3])
def test_clique_shards_read_as_peers(shards):
    table, ids, cache, host, staging = cuda_setup(3, width=32, shards=shards)
    check_kernel(table, ids, cache, host, staging)
    slots = cache.slot_table[ids].cpu()
    assert cache.stats.peer_hits == 2 * int(((slots >= 0) & (slots % shards != 0)).sum())


def test_unsorted_miss_path_matches():
    check_kernel(*cuda_setup(4, width=24), sort_misses=False)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [3, 64, 129])
@pytest.mark.parametrize("share", [0.3, 0.5, 1.0])
def test_cpu_share_of_host_rows_matches_reference(dtype, width, share, monkeypatch):
    gather_module = importlib.import_module("distgnn.cache.gather")  # the package exports a function of that name

    # Small DMA chunks, so a batch crosses several chunk boundaries.
    monkeypatch.setattr(gather_module, "_CPU_CHUNK_BYTES", 97 * width * dtype.itemsize)
    for seed in range(2):
        check_kernel(*cuda_setup(20 + seed, width=width, dtype=dtype), cpu_share=share)


def test_extension_errors_are_raised_with_their_values():
    """A failed check with formatted values raises (it crashed the process on the GPU image: csrc/cuda/check.h)."""
    from distgnn.native.cuda import gather_kernels

    out = torch.empty(4, 8, device="cuda")
    keys = torch.zeros(4, dtype=torch.int64, device="cuda")
    unplaced = torch.zeros(2, dtype=torch.int64, device="cuda")
    args = (out, keys, keys, 10, 15, True)
    with pytest.raises(RuntimeError, match=r"skip must hold \[begin, end\), got 3 entries"):
        gather_kernels().gather_rows(
            *args, None, 0, None, None, [], unplaced, torch.zeros(3, dtype=torch.int64, device="cuda")
        )
    wrong = torch.zeros(10, 4).pin_memory()
    with pytest.raises(RuntimeError, match=r"host rows must be \(rows, 8\) of Float, got \[10, 4\] of Float"):
        gather_kernels().gather_rows(*args, wrong, 0, None, None, [], unplaced)
    with pytest.raises(RuntimeError, match="keys must be on cuda:0, got cpu"):
        gather_kernels().gather_rows(out, keys.cpu(), keys, 10, 15, True, None, 0, None, None, [], unplaced)


@pytest.mark.parametrize("seed", range(10))
def test_share_range_kernel_matches_the_torch_reference(seed):
    from distgnn.cache.gather import cpu_share_range
    from distgnn.native.cuda import gather_kernels

    gen = torch.Generator().manual_seed(seed)
    n = int(torch.randint(0, 5000, (1,), generator=gen))
    keys = torch.sort(torch.randint(0, 3000, (n,), generator=gen)).values.cuda()  # runs of equal keys
    start = int(torch.randint(0, 2500, (1,), generator=gen))
    host = HostTier(torch.zeros(int(torch.randint(1, 1500, (1,), generator=gen)), 4), start)
    for share in (0.0, 0.0001, 0.25, 0.5, 0.999, 1.0, float(torch.rand(1, generator=gen))):
        got = gather_kernels().share_range(keys, host.start, host.end, share)
        assert got.tolist() == cpu_share_range(keys, host, share).tolist(), (share, n, host.start, host.end)


def test_share_range_refuses_a_share_outside_zero_to_one():
    from distgnn.native.cuda import gather_kernels

    with pytest.raises(RuntimeError, match="share must be in \\[0, 1\\], got 1.5"):
        gather_kernels().share_range(torch.arange(10, device="cuda"), 0, 10, 1.5)


def test_cpu_share_with_host_tier_only_and_repeated_ids():
    table = torch.randn(3000, 32)
    host = HostTier(pinned_rows(table), 0)
    ids = torch.randint(0, 3000, (5000,), device="cuda") // 3 * 3  # every id repeats
    out = gather(poisoned(5000, 32, torch.float32), ids, host=host, impl="cuda", cpu_share=0.6)
    assert torch.equal(out, table[ids.cpu()].cuda())


def test_cpu_share_binding_refuses_bad_arguments():
    from distgnn.native.cuda import gather_kernels

    out = torch.empty(4, 8, device="cuda")
    keys = torch.arange(4, dtype=torch.int64, device="cuda")
    unplaced = torch.zeros(2, dtype=torch.int64, device="cuda")
    host = pinned_rows(torch.randn(10, 8))
    call = gather_kernels().gather_rows_cpu_share
    with pytest.raises(RuntimeError, match="reads host rows in host memory, got them on cuda:0"):
        call(out, keys, keys, 10, 15, host.cuda(), 0, None, None, [], unplaced, 0.5, 4)
    with pytest.raises(RuntimeError, match="chunk_rows must be >= 1, got 0"):
        call(out, keys, keys, 10, 15, host, 0, None, None, [], unplaced, 0.5, 0)
    with pytest.raises(RuntimeError, match="share must be in \\[0, 1\\], got 2"):
        call(out, keys, keys, 10, 15, host, 0, None, None, [], unplaced, 2.0, 4)


def test_cpu_share_on_a_side_stream_is_ordered_on_that_stream():
    """A loader gathers on its own stream: the CPU's rows must be in ``out`` for work queued after on that stream."""
    table, ids, cache, host, staging = cuda_setup(31, width=64)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        out = gather(poisoned(len(ids), 64, table.dtype), ids, cache=cache, host=host, staging=staging, cpu_share=0.7)
        total = out.double().sum(dim=1)  # queued on the side stream after the gather
    side.synchronize()
    expected = table[ids.cpu()].cuda()
    assert torch.equal(out, expected)
    assert torch.equal(total, expected.double().sum(dim=1))


def test_cpu_share_releases_the_gil_while_the_cpu_gathers():
    """Other Python threads (a loader's sampler) run while the CPU share gathers its rows."""
    import threading
    import time

    from distgnn.native.cuda import gather_kernels

    table = pinned_rows(torch.randn(400_000, 128))
    ids = torch.randperm(400_000, device="cuda")[:300_000]
    host = HostTier(table, 0)
    plan, _, unplaced = plan_gather_cuda(ids, None, key_space(None, host, None))
    out = poisoned(ids.shape[0], 128, torch.float32)
    stamps, stop = [], threading.Event()

    def tick():
        while not stop.is_set():
            stamps.append(time.perf_counter())

    ticker = threading.Thread(target=tick)
    ticker.start()
    try:
        time.sleep(0.01)
        began = time.perf_counter()
        gather_kernels().gather_rows_cpu_share(
            out, plan.keys, plan.order, plan.hit_base, plan.bad_key, table, 0, None, None, [], unplaced, 1.0, 4096
        )
        ended = time.perf_counter()
    finally:
        stop.set()
        ticker.join()
    torch.cuda.synchronize()
    assert torch.equal(out, table[ids.cpu()].cuda())
    inside = [s for s in stamps if began < s < ended]
    assert len(inside) > 10, f"no other thread ran during the {1e3 * (ended - began):.1f} ms call"


def test_cpu_share_still_names_ids_in_no_tier():
    table = torch.randn(100, 8)
    host = HostTier(pinned_rows(table[:50]), 0)
    with pytest.raises(InputError, match="in no tier"):
        gather(
            poisoned(4, 8, torch.float32),
            torch.tensor([1, 70, 2, 3], device="cuda"),
            host=host,
            impl="cuda",
            cpu_share=0.5,
        )


def test_many_repeats_and_large_batch():
    table, _, cache, host, staging = cuda_setup(5, num_nodes=20000, width=128, batch=10)
    ids = torch.randint(0, 200, (300_000,), device="cuda") * 97 % 20000
    staged = remote_misses(ids, cache=cache, host=host).cpu()
    check_kernel(table, ids, cache, host, StagingTier(staged, pinned_rows(table[staged])))


def test_empty_batch_launches_nothing():
    table, _, cache, host, staging = cuda_setup(6)
    out = gather(
        poisoned(0, 7, torch.float32),
        torch.empty(0, dtype=torch.int64, device="cuda"),
        cache=cache,
        host=host,
        staging=staging,
        impl="cuda",
    )
    assert out.shape == (0, 7)


def test_rows_on_the_gpu_serve_as_host_tier():
    table = torch.randn(100, 16, device="cuda")
    ids = torch.randint(0, 100, (500,), device="cuda")
    out = gather(poisoned(500, 16, torch.float32), ids, host=HostTier(table, 0), impl="cuda")
    assert torch.equal(out, table[ids])


def test_pageable_host_rows_are_refused():
    with pytest.raises(InputError, match="pageable"):
        gather(
            poisoned(2, 4, torch.float32),
            torch.tensor([0, 1], device="cuda"),
            host=HostTier(torch.randn(4, 4), 0),
            impl="cuda",
        )


def test_registered_shm_npy_mapping_is_read_zero_copy():
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm")
    path = shm / f"distgnn-test{os.getpid()}{uuid.uuid4().hex[:6]}-p0-feat"
    try:
        table = torch.randn(4096, 100, dtype=torch.float16)
        mapped = np.lib.format.open_memmap(path, mode="w+", dtype=np.float16, shape=tuple(table.shape))
        mapped[:] = table.numpy()
        rows = torch.from_numpy(mapped)
        ids = torch.randint(0, 4096, (9000,), device="cuda")
        with HostRegistration(rows) as registration:
            assert registration.registered and rows.is_pinned()
            out = gather(poisoned(9000, 100, torch.float16), ids, host=HostTier(rows, 0), impl="cuda")
            torch.cuda.synchronize()
        assert not registration.registered
        assert torch.equal(out.cpu(), table[ids.cpu()])
        del rows, mapped
    finally:
        path.unlink(missing_ok=True)


@pytest.mark.parametrize("bad", [[3, 70], [-1], [1000]])
def test_ids_in_no_tier_raise_after_the_launch(bad):
    cache = FeatureCache.replicate(torch.tensor([1, 2]), torch.randn(2, 4), 100, "cuda")
    host = HostTier(pinned_rows(torch.randn(50, 4)), 0)
    ids = torch.tensor([1, 5, *bad], device="cuda")
    with pytest.raises(InputError, match="in no tier"):
        gather(poisoned(len(ids), 4, torch.float32), ids, cache=cache, host=host, impl="cuda")


def test_hit_counters_match_between_kernel_and_reference():
    table, ids, cache, host, staging = cuda_setup(8, shards=2)
    gather(poisoned(len(ids), 7, torch.float32), ids, cache=cache, host=host, staging=staging, impl="cuda")
    kernel = (cache.stats.lookups, cache.stats.local_hits, cache.stats.peer_hits)
    cache.stats.reset()
    gather(poisoned(len(ids), 7, torch.float32), ids, cache=cache, host=host, staging=staging, impl="torch")
    assert kernel == (cache.stats.lookups, cache.stats.local_hits, cache.stats.peer_hits)
    assert kernel[1] > 0 and kernel[2] > 0


@pytest.mark.parametrize("sort_misses", [True, False])
@pytest.mark.parametrize("table_dtype", [torch.int32, torch.int64])
def test_cuda_planner_matches_torch_planner(sort_misses, table_dtype):
    table, ids, cache, host, staging = cuda_setup(9, shards=3)
    cache.slot_table = cache.slot_table.to(table_dtype)
    ids = torch.cat([ids, torch.tensor([-5, 10**9, 4999, 5000], device="cuda")])
    keys = key_space(cache, host, staging)
    plan, hits, unplaced = plan_gather_cuda(ids, cache, keys, sort_misses)
    expected = plan_gather(ids, cache, keys, sort_misses)
    assert torch.equal(plan.keys, expected.keys)
    assert torch.equal(plan.order, expected.order)
    slots = cache.slot_table[ids.clamp(0, 4999)].long().masked_fill(ids > 4999, -1).masked_fill(ids < 0, -1)
    assert hits.tolist() == [int(((slots >= 0) & (slots % 3 == 0)).sum()), int(((slots >= 0) & (slots % 3 != 0)).sum())]
    assert unplaced[0].item() == int((expected.keys == expected.bad_key).sum()) >= 2


def full_cache(seed, *, num_nodes=3000, width=7, dtype=torch.float32, shards=1, table_dtype=torch.int32):
    """A table, a cache holding all of it (hot order shuffled, so slots are not the identity) and ids with repeats."""
    gen = torch.Generator().manual_seed(seed)
    table = torch.randn(num_nodes, width, generator=gen).to(dtype)
    hot = torch.randperm(num_nodes, generator=gen)
    cache = FeatureCache.clique(hot, table[hot], num_nodes, ["cuda"] * shards)[0]
    cache.slot_table = cache.slot_table.to(table_dtype)
    ids = torch.randint(0, num_nodes, (num_nodes + 500,), generator=gen).cuda()
    return table, cache, ids


def refuse_planned_path(monkeypatch):
    def planned(*args, **kwargs):
        raise AssertionError("the all-hit gather planned")

    monkeypatch.setattr(importlib.import_module("distgnn.cache.gather"), "_gather_cuda", planned)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [1, 3, 8, 100, 128, 129])
@pytest.mark.parametrize("shards", [1, 3])
def test_all_hit_path_matches_reference_without_planning(dtype, width, shards, monkeypatch):
    table, cache, ids = full_cache(width + shards, width=width, dtype=dtype, shards=shards)
    assert cache.covers_all
    ref = gather(poisoned(len(ids), width, dtype), ids, cache=cache, impl="torch")
    reference_hits = (cache.stats.local_hits, cache.stats.peer_hits)
    cache.stats.reset()
    refuse_planned_path(monkeypatch)
    host = HostTier(pinned_rows(table[:100]), 0)  # a host tier inside the table is no reason to plan
    out = gather(poisoned(len(ids), width, dtype), ids, cache=cache, host=host, impl="cuda")
    assert torch.equal(out, table[ids.cpu()].cuda())
    assert torch.equal(ref, out)
    assert (cache.stats.lookups, cache.stats.local_hits, cache.stats.peer_hits) == (len(ids), *reference_hits)


@pytest.mark.parametrize("table_dtype", [torch.int32, torch.int64])
def test_all_hit_path_reads_int64_slot_tables_and_large_batches(table_dtype, monkeypatch):
    table, cache, _ = full_cache(3, num_nodes=20000, width=64, table_dtype=table_dtype)
    refuse_planned_path(monkeypatch)
    ids = torch.randint(0, 20000, (300_000,), device="cuda")
    out = gather(poisoned(len(ids), 64, torch.float32), ids, cache=cache, impl="cuda")
    assert torch.equal(out, table.cuda()[ids])


def test_all_hit_path_reports_bad_ids_on_a_later_look(monkeypatch):
    table, cache, _ = full_cache(4, num_nodes=50, width=5)
    refuse_planned_path(monkeypatch)
    ids = torch.tensor([3, 50, 7, -2, 49], device="cuda")
    out = gather(poisoned(5, 5, torch.float32), ids, cache=cache, impl="cuda")  # returns without waiting
    with pytest.raises(InputError, match=r"got id (50|-2), outside the slot table's \[0, 50\)"):
        cache.check()
    assert torch.equal(out[[0, 2, 4]].cpu(), table[[3, 7, 49]])
    assert torch.equal(out[[1, 3]].cpu(), torch.zeros(2, 5))  # filled, never left unwritten
    cache.check()  # raised once
    gather(poisoned(1, 5, torch.float32), torch.tensor([99], device="cuda"), cache=cache, impl="cuda")
    torch.cuda.synchronize()
    with pytest.raises(InputError, match="got id 99"):
        gather(poisoned(1, 5, torch.float32), torch.tensor([1], device="cuda"), cache=cache, impl="cuda")


def test_all_hit_path_is_not_taken_where_other_tiers_hold_more(monkeypatch):
    table, cache, _ = full_cache(5, num_nodes=40, width=4)
    bigger = torch.randn(60, 4)
    host = HostTier(pinned_rows(bigger[40:]), 40)  # ids 40..59 live on the host: the cache is not all of it
    ids = torch.tensor([1, 45, 39, 59, 2], device="cuda")
    planned = []
    module = importlib.import_module("distgnn.cache.gather")  # the package exports a function of that name
    real = module._gather_cuda
    monkeypatch.setattr(module, "_gather_cuda", lambda *a: planned.append(1) or real(*a))
    out = gather(poisoned(5, 4, torch.float32), ids, cache=cache, host=host, impl="cuda")
    assert planned == [1]
    assert torch.equal(out.cpu(), torch.cat([table, bigger[40:]])[ids.cpu()])


def test_all_hit_path_binding_refuses_bad_arguments():
    from distgnn.native.cuda import gather_kernels

    _, cache, ids = full_cache(6, num_nodes=20, width=4)
    kernels = gather_kernels()
    out = poisoned(len(ids), 4, torch.float32)
    hits = torch.zeros(2, dtype=torch.int64, device="cuda")
    with pytest.raises(RuntimeError, match="pinned"):
        kernels.gather_cached(out, ids, cache.slot_table, cache.shards, 0, hits, torch.zeros(2, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="one entry per output row"):
        kernels.gather_cached(out[:3], ids, cache.slot_table, cache.shards, 0, hits, cache.device_errors())
    with pytest.raises(RuntimeError, match="local_rank 1 out of range"):
        kernels.gather_cached(out, ids, cache.slot_table, cache.shards, 1, hits, cache.device_errors())
