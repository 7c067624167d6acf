"""``gather``: fill a batch's feature rows from every tier, with one CUDA kernel or the torch reference.

Tiers, in lookup order: the GPU cache (local shard and clique peers' shards), the local partition's rows in
host memory (:class:`HostTier`), and the staging rows fetched from remote servers (:class:`StagingTier`).
On a CUDA output with the extension built, the GPU plans the batch (a slot-lookup kernel, then a radix sort
of the keys, so misses are deduplicated and read in address order) and one kernel launch copies every row;
otherwise a plain torch reference indexes each tier in turn. Both give bitwise-identical rows. When the cache
holds every node (``FeatureCache.covers_all``), every id is a hit: one launch looks each id up and copies its row,
with no plan and no host sync (the all-hit path).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from distgnn.cache.feature_cache import FeatureCache
from distgnn.cache.tiers import HostTier, StagingTier, check_rows
from distgnn.errors import InputError
from distgnn.native.cuda import gather_available, gather_kernels

IMPLEMENTATIONS = ("auto", "cuda", "torch")


def gather(
    out: torch.Tensor,
    ids: torch.Tensor,
    *,
    cache: FeatureCache | None = None,
    host: HostTier | None = None,
    staging: StagingTier | None = None,
    impl: str = "auto",
    sort_misses: bool = True,
    cpu_share: float = 0.0,
) -> torch.Tensor:
    """Writes the feature row of each ``ids[i]`` into ``out[i]`` and returns ``out``.

    Args:
        out: ``(B, F)`` float32/float16/bfloat16 output, contiguous; its device picks the implementation.
        ids: ``(B,)`` integer global node ids, any order, repeats allowed, any device.
        cache: GPU cache; an id whose slot is not -1 is read from the cache (local or peer shard).
        host: local partition rows; uncached ids in ``[host.start, host.end)`` are read here.
        staging: remote rows; every other id must be in ``staging.ids``.
        impl: ``"cuda"`` (the kernel; raises ExtensionBuildError when it cannot be built), ``"torch"`` (the
            reference), or ``"auto"`` (the kernel for a CUDA ``out`` when available, else the reference).
        sort_misses: deduplicate and sort misses before the host reads (CUDA path); False exists to measure
            what sorting buys.
        cpu_share: fraction (0..1) of the host tier's rows that CPU threads gather into pinned memory and the
            copy engine moves to the GPU while the kernel reads the rest zero-copy (CUDA path with sorted
            misses and host rows in host memory; the reference path ignores it). Zero-copy reads of scattered
            rows stall on address translation well below the link's bandwidth (docs/benchmarks-history.md, "GPU
            gather"); the DMA path streams dense pinned buffers, so the two together fill more of the link.
            The CPU's part runs inside one extension call with the GIL released, so other Python threads (a
            loader's sampler) keep running meanwhile.

    The CUDA path synchronises the current stream once, at the end, to check that every id was found (and,
    with a ``cpu_share``, once after planning, to hand the CPU its rows); it runs on the current stream, so
    a loader can gather on a side stream. The all-hit path (a CUDA ``out``, a cache on its device that holds
    every node, no staging rows and no host rows beyond the cache's table) never synchronises: an id outside
    the table zero-fills its row and is raised by the next gather through that cache or by ``cache.check()``.

    Raises:
        InputError: shapes or dtypes disagree, or an id is in no tier.
    """
    if impl not in IMPLEMENTATIONS:
        raise InputError(f"impl must be one of {IMPLEMENTATIONS}, got {impl!r}")
    if not 0.0 <= cpu_share <= 1.0:
        raise InputError(f"cpu_share must be a fraction in [0, 1], got {cpu_share!r}")
    ids = _check_inputs(out, ids, cache, host, staging)
    use_kernel = impl == "cuda" or (impl == "auto" and out.is_cuda and gather_available())
    if use_kernel:
        if not out.is_cuda:
            raise InputError(f"impl='cuda' needs a CUDA output tensor, got one on {out.device}")
        if _all_hit(out, cache, host, staging):
            _gather_cached(out, ids, cache)
        else:
            _gather_cuda(out, ids, cache, host, staging, sort_misses, cpu_share)
    else:
        _gather_reference(out, ids, cache, host, staging)
    return out


def remote_misses(
    ids: torch.Tensor, *, cache: FeatureCache | None = None, host: HostTier | None = None
) -> torch.Tensor:
    """Sorted unique ids of ``ids`` that neither the cache nor the host tier holds: what to fetch into staging."""
    ids = ids.to(torch.int64)
    missing = torch.ones_like(ids, dtype=torch.bool)
    if cache is not None:
        missing &= cache_slots(cache, ids) < 0
    if host is not None:
        missing &= (ids < host.start) | (ids >= host.end)
    return torch.unique(ids[missing])


def cache_slots(cache: FeatureCache, ids: torch.Tensor) -> torch.Tensor:
    """Logical cache slot of each id as int64 on ``ids.device``, -1 where not cached or outside the table."""
    if cache.num_nodes == 0:
        return torch.full_like(ids, -1)
    inside = (ids >= 0) & (ids < cache.num_nodes)
    index = ids.clamp(0, cache.num_nodes - 1).to(cache.device)
    return cache.slot_table[index].to(device=ids.device, dtype=torch.int64).masked_fill_(~inside, -1)


@dataclass(frozen=True)
class GatherPlan:
    """The kernel's work list: ``keys`` and ``order`` are ``(B,)`` int64 on the output's device.

    Item ``i`` fills output row ``order[i]``. A key below ``hit_base`` is the global id to read from the host
    range or the staging rows; ``hit_base + s`` (below ``bad_key``) is a cache hit of logical slot ``s``;
    ``bad_key`` marks an id no tier can hold (negative, or at or above ``hit_base``). With ``deduplicate`` the
    keys are sorted (stably): misses first, ascending, then hits by slot, and the first item of a run of equal
    keys reads the row once for the whole run.
    """

    keys: torch.Tensor
    order: torch.Tensor
    hit_base: int
    bad_key: int
    deduplicate: bool


def key_space(cache: FeatureCache | None, host: HostTier | None, staging: StagingTier | None) -> tuple[int, int]:
    """``(hit_base, bad_key)``: hit_base above every id the tiers hold, bad_key = ``2^k - 1`` above every hit key.

    The radix sort then orders only the low ``k`` bits of the keys.
    """
    hit_base = max(
        cache.num_nodes if cache is not None else 0,
        host.end if host is not None else 0,
        int(staging.ids[-1]) + 1 if staging is not None and staging.ids.numel() else 0,
    )
    capacity = cache.capacity if cache is not None else 0
    return hit_base, (1 << max(1, (hit_base + capacity).bit_length())) - 1


def plan_gather(
    ids: torch.Tensor, cache: FeatureCache | None, keys: tuple[int, int], sort_misses: bool = True
) -> GatherPlan:
    """The plan in torch ops: what the CUDA planner (csrc/cuda/plan.cu) computes, for tests and CPU tensors."""
    hit_base, bad_key = keys
    slots = cache_slots(cache, ids) if cache is not None else torch.full_like(ids, -1)
    unkeyable = (slots < 0) & ((ids < 0) | (ids >= hit_base))
    plan_keys = torch.where(slots >= 0, hit_base + slots, ids).masked_fill_(unkeyable, bad_key)
    if sort_misses:
        plan_keys, order = torch.sort(plan_keys, stable=True)
    else:
        order = torch.arange(ids.shape[0], device=ids.device)
    return GatherPlan(plan_keys, order, hit_base, bad_key, sort_misses)


def plan_gather_cuda(
    ids: torch.Tensor, cache: FeatureCache | None, keys: tuple[int, int], sort_misses: bool = True
) -> tuple[GatherPlan, torch.Tensor, torch.Tensor]:
    """The plan from the CUDA planner, with its ``[local, peer]`` hit and ``[count, example]`` unplaced counters."""
    hit_base, bad_key = keys
    counters = torch.zeros(4, dtype=torch.int64, device=ids.device)  # one launch for both
    hits, unplaced = counters[:2], counters[2:]
    plan_keys, order = gather_kernels().plan(
        ids,
        None if cache is None else cache.slot_table,
        1 if cache is None else cache.num_shards,
        0 if cache is None else cache.local_rank,
        hit_base,
        bad_key,
        sort_misses,
        hits,
        unplaced,
    )
    return GatherPlan(plan_keys, order, hit_base, bad_key, sort_misses), hits, unplaced


def _all_hit(out: torch.Tensor, cache: FeatureCache | None, host: HostTier | None, staging: StagingTier | None) -> bool:
    """Whether every id the tiers can hold is a cache hit (and the cache is on ``out``'s device)."""
    return (
        cache is not None
        and cache.covers_all
        and cache.device == out.device
        and (host is None or host.end <= cache.num_nodes)
        and (staging is None or staging.ids.numel() == 0)
    )


def _gather_cached(out: torch.Tensor, ids: torch.Tensor, cache: FeatureCache) -> None:
    """The all-hit path: one launch, no plan, no host sync; ids outside the table are raised on a later look."""
    cache.raise_device_errors()
    gather_kernels().gather_cached(
        out,
        ids.to(out.device).contiguous(),
        cache.slot_table,
        cache.shards,
        cache.local_rank,
        cache.stats.counter(cache.device),
        cache.device_errors(),
    )
    cache.stats.lookups += ids.shape[0]


def _gather_cuda(
    out: torch.Tensor,
    ids: torch.Tensor,
    cache: FeatureCache | None,
    host: HostTier | None,
    staging: StagingTier | None,
    sort_misses: bool,
    cpu_share: float = 0.0,
) -> None:
    """Plans and copies with two kernels and a sort on the GPU; synchronises once, to check every id was found."""
    extension = gather_kernels()
    if cache is not None and cache.device != out.device:
        raise InputError(f"the cache's slot table is on {cache.device} but the output on {out.device}")
    for tier, name in ((host, "host"), (staging, "staging")):
        rows = None if tier is None else tier.rows
        if rows is not None and rows.numel() and not extension.device_accessible(rows.data_ptr()):
            raise InputError(
                f"{name} rows are in pageable memory, which the GPU cannot read: pin them (tensor.pin_memory()) "
                "or register them (distgnn.cache.HostRegistration)"
            )
    plan, hits, unplaced = plan_gather_cuda(ids.to(out.device), cache, key_space(cache, host, staging), sort_misses)
    if cache is not None:
        cache.stats.record(ids.shape[0], hits)
    work = (out, plan.keys, plan.order, plan.hit_base, plan.bad_key)
    others = (
        None if staging is None else staging.rows,
        None if staging is None else staging.ids.to(out.device),
        [] if cache is None else cache.shards,
        unplaced,
    )
    if cpu_share > 0 and host is not None and not host.rows.is_cuda and plan.deduplicate and ids.numel():
        chunk_rows = max(1, _CPU_CHUNK_BYTES // (out.shape[1] * out.element_size()))
        extension.gather_rows_cpu_share(*work, host.rows, host.start, *others, cpu_share, chunk_rows)
    else:
        host_rows, host_start = (None, 0) if host is None else (host.rows, host.start)
        extension.gather_rows(*work, plan.deduplicate, host_rows, host_start, *others)
    count, example = unplaced.tolist()
    if count:
        raise InputError(
            f"{count} ids are in no tier (not cached, outside the host range, not staged), e.g. {example}; "
            "fetch them into the staging tier first (see remote_misses)"
        )


# Bytes per CPU gather + DMA step of the CPU share, so the copy engine streams one chunk while the CPU threads
# gather the next (chunks of a few MB measured alike, smaller ones slower: docs/benchmarks-history.md, "GPU
# gather").
_CPU_CHUNK_BYTES = 4 << 20


def cpu_share_range(keys: torch.Tensor, host: HostTier, cpu_share: float) -> torch.Tensor:
    """``[begin, end)`` as a ``(2,)`` int64 tensor on ``keys``' device: the plan items the CPU fills, the first
    ``cpu_share`` of the host tier's misses among the sorted ``keys``, extended to the end of a run of equal keys.

    The torch reference of the extension's ``share_range`` kernel (csrc/cuda/plan.cu), which the gather uses: one
    launch where these are a dozen.
    """
    begin = torch.searchsorted(keys, host.start).reshape(1)
    host_end = torch.searchsorted(keys, host.end).reshape(1)
    end = begin + ((host_end - begin).to(torch.float64) * cpu_share).round().to(torch.int64)
    last = keys[(end - 1).clamp_min(0)]
    end = torch.where(end > begin, torch.searchsorted(keys, last, right=True), end)
    return torch.cat([begin, end])


def _gather_reference(
    out: torch.Tensor,
    ids: torch.Tensor,
    cache: FeatureCache | None,
    host: HostTier | None,
    staging: StagingTier | None,
) -> None:
    """Plain per-tier indexing; every index moves to the device of the rows it indexes."""
    ids = ids.to(out.device)
    if ids.numel():
        low, high = (int(v) for v in torch.aminmax(ids))
        if low < 0:
            raise InputError(f"ids must be >= 0, got {low}")
        if cache is not None and high >= cache.num_nodes:
            raise InputError(f"id {high} is outside the cache's slot table of {cache.num_nodes} nodes")
    placed = torch.zeros(ids.shape[0], dtype=torch.bool, device=out.device)
    if cache is not None:
        slots = cache.slot_table[ids.to(cache.device)].to(device=out.device, dtype=torch.int64)
        _count(cache, slots)
        for rank, shard in enumerate(cache.shards):
            take = (slots >= 0) & (slots % cache.num_shards == rank)
            _copy_rows(out, take, shard, slots[take] // cache.num_shards)
        placed |= slots >= 0
    if host is not None:
        take = ~placed & (ids >= host.start) & (ids < host.end)
        _copy_rows(out, take, host.rows, ids[take] - host.start)
        placed |= take
    if staging is not None and staging.ids.numel() > 0:
        staging_ids = staging.ids.to(out.device)
        pos = torch.searchsorted(staging_ids, ids).clamp_(max=staging_ids.shape[0] - 1)
        take = ~placed & (staging_ids[pos] == ids)
        _copy_rows(out, take, staging.rows, pos[take])
        placed |= take
    if bool((~placed).any()):
        examples = ids[~placed][:5].tolist()
        raise InputError(
            f"{int((~placed).sum())} ids are in no tier (not cached, outside the host range, not staged), "
            f"e.g. {examples}; fetch them into the staging tier first (see remote_misses)"
        )


def _copy_rows(out: torch.Tensor, take: torch.Tensor, rows: torch.Tensor, row_index: torch.Tensor) -> None:
    out[take] = rows[row_index.to(rows.device)].to(out.device)


def _count(cache: FeatureCache, slots: torch.Tensor) -> None:
    """Adds one gather's lookups and hits to the cache's counters, without synchronising."""
    hit = slots >= 0
    hits = hit.sum()
    peer = (hit & (slots % cache.num_shards != cache.local_rank)).sum() if cache.num_shards > 1 else hits * 0
    cache.stats.record(slots.shape[0], torch.stack([hits - peer, peer]))


def _check_inputs(
    out: torch.Tensor,
    ids: torch.Tensor,
    cache: FeatureCache | None,
    host: HostTier | None,
    staging: StagingTier | None,
) -> torch.Tensor:
    """Validates shapes and dtypes (nothing that needs a device sync); returns ids as int64."""
    check_rows(out, "out")
    if ids.dim() != 1 or ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.is_complex():
        raise InputError(f"ids must be a 1-D integer tensor, got {ids.dtype} {tuple(ids.shape)}")
    if ids.shape[0] != out.shape[0]:
        raise InputError(f"out has {out.shape[0]} rows for {ids.shape[0]} ids; allocate one row per id")
    tiers = [("host rows", host.rows if host else None), ("staging rows", staging.rows if staging else None)]
    tiers += [("cache shard", shard) for shard in (cache.shards if cache else [])]
    for name, rows in tiers:
        if rows is not None and (rows.dtype != out.dtype or rows.shape[1] != out.shape[1]):
            raise InputError(
                f"{name} are {rows.dtype} width {rows.shape[1]} but out is {out.dtype} width {out.shape[1]}"
            )
    return ids.to(torch.int64)
