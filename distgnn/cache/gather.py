"""``gather``: fill a batch's feature rows from every tier, with one CUDA kernel or the torch reference.

Tiers, in lookup order: the GPU cache (local shard and clique peers' shards), the local partition's rows in
host memory (:class:`HostTier`), and the staging rows fetched from remote servers (:class:`StagingTier`).
On a CUDA output with the extension built, ids are planned with torch ops on the GPU (cache lookup, misses
deduplicated and sorted) and one kernel launch copies every row; otherwise a plain torch reference indexes
each tier in turn. Both give bitwise-identical rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from distgnn.cache.extension import extension_available, load_extension
from distgnn.cache.feature_cache import FeatureCache
from distgnn.cache.tiers import HostTier, StagingTier, check_rows
from distgnn.errors import InputError

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

    Raises:
        InputError: shapes or dtypes disagree, or an id is in no tier.
    """
    if impl not in IMPLEMENTATIONS:
        raise InputError(f"impl must be one of {IMPLEMENTATIONS}, got {impl!r}")
    ids = _check_inputs(out, ids, cache, host, staging)
    use_kernel = impl == "cuda" or (impl == "auto" and out.is_cuda and extension_available())
    if use_kernel:
        if not out.is_cuda:
            raise InputError(f"impl='cuda' needs a CUDA output tensor, got one on {out.device}")
        _gather_cuda(out, ids, cache, host, staging, sort_misses)
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
        missing &= _lookup_slots(cache, ids) < 0
    if host is not None:
        missing &= (ids < host.start) | (ids >= host.end)
    return torch.unique(ids[missing])


@dataclass(frozen=True)
class GatherPlan:
    """What the kernel executes; every tensor is int64 on the output's device.

    ``miss_rows[u]`` is a host row (``< host_rows``) or ``host_rows +`` a staging row; it is copied to output rows
    ``miss_dst[miss_offsets[u]:miss_offsets[u + 1]]``. Hit ``h`` copies logical cache slot ``hit_slots[h]`` to
    output row ``hit_dst[h]``.
    """

    miss_rows: torch.Tensor
    miss_offsets: torch.Tensor
    miss_dst: torch.Tensor
    hit_dst: torch.Tensor
    hit_slots: torch.Tensor
    host_rows: int


def plan_gather(
    ids: torch.Tensor,
    cache: FeatureCache | None,
    host: HostTier | None,
    staging: StagingTier | None,
    sort_misses: bool = True,
) -> GatherPlan:
    """Splits ``ids`` (int64, on the output's device) into cache hits and per-source-row misses."""
    device = ids.device
    positions = torch.arange(ids.shape[0], device=device)
    if cache is not None:
        slots = _lookup_slots(cache, ids)
        hit = slots >= 0
        hit_dst, miss_pos = positions[hit], positions[~hit]
        hit_slots = slots[hit]
    else:
        hit_dst = hit_slots = positions[:0]
        miss_pos = positions
    miss_ids = ids[miss_pos]
    if sort_misses:
        sorted_ids, order = torch.sort(miss_ids)
        unique_ids, counts = torch.unique_consecutive(sorted_ids, return_counts=True)
        miss_dst = miss_pos[order]
        miss_offsets = torch.zeros(unique_ids.shape[0] + 1, dtype=torch.int64, device=device)
        torch.cumsum(counts, 0, out=miss_offsets[1:])
    else:
        unique_ids, miss_dst = miss_ids, miss_pos
        miss_offsets = torch.arange(miss_ids.shape[0] + 1, device=device)

    host_rows = 0 if host is None else host.rows.shape[0]
    miss_rows = torch.full_like(unique_ids, -1)
    if host is not None:
        local = (unique_ids >= host.start) & (unique_ids < host.end)
        miss_rows = torch.where(local, unique_ids - host.start, miss_rows)
    if staging is not None and staging.ids.numel() > 0:
        staging_ids = staging.ids.to(device)
        pos = torch.searchsorted(staging_ids, unique_ids).clamp_(max=staging_ids.shape[0] - 1)
        found = (staging_ids[pos] == unique_ids) & (miss_rows < 0)
        miss_rows = torch.where(found, host_rows + pos, miss_rows)
    _raise_if_unplaced(unique_ids, miss_rows < 0)
    return GatherPlan(miss_rows, miss_offsets, miss_dst, hit_dst, hit_slots.to(torch.int64), host_rows)


def _gather_cuda(
    out: torch.Tensor,
    ids: torch.Tensor,
    cache: FeatureCache | None,
    host: HostTier | None,
    staging: StagingTier | None,
    sort_misses: bool,
) -> None:
    extension = load_extension()
    if cache is not None and cache.device != out.device:
        raise InputError(f"the cache's slot table is on {cache.device} but the output on {out.device}")
    for tier, name in ((host, "host"), (staging, "staging")):
        rows = None if tier is None else tier.rows
        if rows is not None and rows.numel() and not extension.device_accessible(rows.data_ptr()):
            raise InputError(
                f"{name} rows are in pageable memory, which the GPU cannot read: pin them (tensor.pin_memory()) "
                "or register them (distgnn.cache.HostRegistration)"
            )
    plan = plan_gather(ids.to(out.device), cache, host, staging, sort_misses)
    _count(cache, plan.hit_slots)
    extension.gather_rows(
        out,
        plan.miss_rows,
        plan.miss_offsets,
        plan.miss_dst,
        None if host is None else host.rows,
        None if staging is None else staging.rows,
        plan.hit_dst,
        plan.hit_slots,
        [] if cache is None else cache.shards,
    )


def _gather_reference(
    out: torch.Tensor,
    ids: torch.Tensor,
    cache: FeatureCache | None,
    host: HostTier | None,
    staging: StagingTier | None,
) -> None:
    """Plain per-tier indexing; every index moves to the device of the rows it indexes."""
    ids = ids.to(out.device)
    placed = torch.zeros(ids.shape[0], dtype=torch.bool, device=out.device)
    if cache is not None:
        slots = _lookup_slots(cache, ids).to(out.device)
        _count(cache, slots[slots >= 0])
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
    _raise_if_unplaced(ids, ~placed)


def _copy_rows(out: torch.Tensor, take: torch.Tensor, rows: torch.Tensor, row_index: torch.Tensor) -> None:
    out[take] = rows[row_index.to(rows.device)].to(out.device)


def _lookup_slots(cache: FeatureCache, ids: torch.Tensor) -> torch.Tensor:
    return cache.slot_table[ids.to(cache.device)].to(ids.device)


def _count(cache: FeatureCache | None, hit_slots: torch.Tensor) -> None:
    """Adds one gather's hits to the cache's counters (lookups are counted in _check_inputs)."""
    if cache is None:
        return
    peer = int((hit_slots % cache.num_shards != cache.local_rank).sum()) if cache.num_shards > 1 else 0
    cache.stats.peer_hits += peer
    cache.stats.local_hits += hit_slots.numel() - peer


def _raise_if_unplaced(ids: torch.Tensor, unplaced: torch.Tensor) -> None:
    if bool(unplaced.any()):
        examples = ids[unplaced][:5].tolist()
        raise InputError(
            f"{int(unplaced.sum())} ids are in no tier (not cached, outside the host range, not staged), "
            f"e.g. {examples}; fetch them into the staging tier first (see remote_misses)"
        )


def _check_inputs(
    out: torch.Tensor,
    ids: torch.Tensor,
    cache: FeatureCache | None,
    host: HostTier | None,
    staging: StagingTier | None,
) -> torch.Tensor:
    """Validates shapes, dtypes and id range; returns ids as int64."""
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
    ids = ids.to(torch.int64)
    if ids.numel():
        low, high = (int(v) for v in torch.aminmax(ids))
        if low < 0:
            raise InputError(f"ids must be >= 0, got {low}")
        if cache is not None and high >= cache.num_nodes:
            raise InputError(f"id {high} is outside the cache's slot table of {cache.num_nodes} nodes")
    if cache is not None:
        cache.stats.lookups += ids.shape[0]
    return ids
