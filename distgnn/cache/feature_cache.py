"""The GPU feature cache: hot rows on one GPU (``replicate``) or sharded over a clique of GPUs (``clique``).

A cache is a list of shards plus a slot table on the reading GPU that maps every global node id to a logical
slot (``-1``: not cached). Logical slot ``s`` is row ``s // G`` of shard ``s % G`` for ``G`` shards, so with
slots given in hotness order each GPU of a clique holds an equal share of every hotness level. One process
may drive several GPUs (tests, single-process clique) or map its peers' shards through CUDA IPC; either way
it hands the shard tensors to :class:`FeatureCache`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from distgnn.cache.tiers import check_rows
from distgnn.errors import InputError

MAX_SHARDS = 16  # kMaxShards in csrc/cuda/gather.h


class CacheStats:
    """Hit counters of one cache view, updated by every gather through it.

    Hits accumulate on the cache's device without synchronising; reading them synchronises.
    """

    def __init__(self) -> None:
        self.lookups = 0
        self._hits: torch.Tensor | None = None  # [local, peer]

    def record(self, lookups: int, hits: torch.Tensor) -> None:
        """Adds ``lookups`` ids and ``hits`` = ``[local, peer]`` hit counts (a device tensor)."""
        self.lookups += lookups
        self.counter(hits.device).add_(hits)

    def counter(self, device: torch.device) -> torch.Tensor:
        """The ``(2,)`` int64 ``[local, peer]`` hit counter on ``device``, which kernels may add to in place."""
        if self._hits is None:
            self._hits = torch.zeros(2, dtype=torch.int64, device=device)
        return self._hits

    @property
    def local_hits(self) -> int:
        return 0 if self._hits is None else int(self._hits[0])

    @property
    def peer_hits(self) -> int:
        return 0 if self._hits is None else int(self._hits[1])

    @property
    def hits(self) -> int:
        return 0 if self._hits is None else int(self._hits.sum())

    def hit_rate(self) -> float:
        """Fraction of looked-up ids found in the cache (0.0 before any lookup)."""
        return self.hits / self.lookups if self.lookups else 0.0

    def reset(self) -> None:
        self.lookups = 0
        self._hits = None

    def __repr__(self) -> str:
        return f"CacheStats(lookups={self.lookups}, local_hits={self.local_hits}, peer_hits={self.peer_hits})"


class FeatureCache:
    """Hot feature rows in GPU memory and the table that finds them.

    Args:
        shards: ``G`` tensors ``(rows_g, F)`` of one dtype and width; ``shards[local_rank]`` is this GPU's.
        slot_table: ``(num_nodes,)`` int32 or int64 on the reading device: logical slot of each global id, -1
            where not cached.
        local_rank: index of this reader's own shard (hits elsewhere count as peer hits).
    """

    def __init__(self, shards: Sequence[torch.Tensor], slot_table: torch.Tensor, local_rank: int = 0) -> None:
        if not 1 <= len(shards) <= MAX_SHARDS:
            raise InputError(f"a cache needs 1 to {MAX_SHARDS} shards, got {len(shards)}")
        for shard in shards:
            check_rows(shard, "cache shard")
            if shard.dtype != shards[0].dtype or shard.shape[1] != shards[0].shape[1]:
                raise InputError(
                    f"cache shards differ: {shard.dtype} width {shard.shape[1]} vs "
                    f"{shards[0].dtype} width {shards[0].shape[1]}"
                )
        if slot_table.dim() != 1 or slot_table.dtype not in (torch.int32, torch.int64):
            raise InputError(f"slot table must be 1-D int32 or int64, got {slot_table.dtype} {tuple(slot_table.shape)}")
        capacity = sum(shard.shape[0] for shard in shards)
        low, high = (int(v) for v in torch.aminmax(slot_table)) if slot_table.numel() else (0, -1)
        if high >= capacity:
            raise InputError(f"slot table points past the {capacity} cached rows; slots must be < capacity")
        if not 0 <= local_rank < len(shards):
            raise InputError(f"local_rank {local_rank} out of range for {len(shards)} shards")
        self.shards = list(shards)
        self.slot_table = slot_table
        self.local_rank = local_rank
        self.stats = CacheStats()
        # Every node has a slot: a gather through this cache alone can take the all-hit path (no plan, no sync).
        self.covers_all = low >= 0
        self._device_errors: torch.Tensor | None = None  # [flag, example id] the all-hit kernel stores into

    def device_errors(self) -> torch.Tensor:
        """``(2,)`` int64 pinned host tensor ``[flag, example id]`` where the all-hit gather kernel reports ids
        outside the slot table (see :meth:`raise_device_errors`)."""
        if self._device_errors is None:
            self._device_errors = torch.zeros(2, dtype=torch.int64, pin_memory=True)
        return self._device_errors

    def raise_device_errors(self) -> None:
        """Raises (once) what all-hit gathers that have finished found on the device; never waits for the GPU.

        Raises:
            InputError: an earlier all-hit gather got an id outside ``[0, num_nodes)`` (its row was zero-filled).
        """
        if self._device_errors is None or not int(self._device_errors[0]):
            return
        example = int(self._device_errors[1])
        self._device_errors.zero_()
        raise InputError(
            f"an earlier gather through this cache got id {example}, outside the slot table's [0, {self.num_nodes}) "
            "(its output row was zero-filled); pass ids of cached nodes only"
        )

    def check(self) -> None:
        """Waits for the cache's device, then raises what the all-hit gathers found (:meth:`raise_device_errors`)."""
        if self._device_errors is not None:
            torch.cuda.synchronize(self.device)
        self.raise_device_errors()

    @property
    def policy(self) -> str:
        return "replicate" if len(self.shards) == 1 else "clique"

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    @property
    def num_nodes(self) -> int:
        return self.slot_table.shape[0]

    @property
    def capacity(self) -> int:
        """Cached rows over all shards."""
        return sum(shard.shape[0] for shard in self.shards)

    @property
    def device(self) -> torch.device:
        return self.slot_table.device

    @property
    def dtype(self) -> torch.dtype:
        return self.shards[0].dtype

    @property
    def row_width(self) -> int:
        return self.shards[0].shape[1]

    def __repr__(self) -> str:
        return (
            f"FeatureCache(policy={self.policy}, rows={self.capacity}, shards={self.num_shards}, "
            f"local_rank={self.local_rank}, width={self.row_width}, dtype={self.dtype}, device={self.device})"
        )

    @classmethod
    def replicate(
        cls, hot_ids: torch.Tensor, rows: torch.Tensor, num_nodes: int, device: torch.device | str
    ) -> FeatureCache:
        """A cache of ``rows`` (``rows[k]`` = features of ``hot_ids[k]``) entirely on ``device``."""
        return cls.clique(hot_ids, rows, num_nodes, [device])[0]

    @classmethod
    def clique(
        cls, hot_ids: torch.Tensor, rows: torch.Tensor, num_nodes: int, devices: Sequence[torch.device | str]
    ) -> list[FeatureCache]:
        """One cache sharded over ``devices``; returns one view per device (its own slot table, shared shards).

        ``hot_ids[k]`` gets logical slot ``k``, so pass ids hottest first (as :func:`choose_hot_set` returns them).
        """
        check_rows(rows, "cache rows")
        hot_ids = hot_ids.to(torch.int64)
        if hot_ids.dim() != 1 or hot_ids.shape[0] != rows.shape[0]:
            raise InputError(f"{tuple(hot_ids.shape)} hot ids for {rows.shape[0]} rows; give one id per row")
        if hot_ids.numel() and (int(hot_ids.min()) < 0 or int(hot_ids.max()) >= num_nodes):
            raise InputError(f"hot ids must lie in [0, {num_nodes})")
        if torch.unique(hot_ids).numel() != hot_ids.numel():
            raise InputError("hot ids repeat; each cached id needs exactly one slot")
        num_shards = len(devices)
        shards = [rows[g::num_shards].to(device).contiguous() for g, device in enumerate(devices)]
        return [
            cls(shards, slot_table(hot_ids, num_nodes, device), local_rank=rank) for rank, device in enumerate(devices)
        ]


def slot_table(hot_ids: torch.Tensor, num_nodes: int, device: torch.device | str) -> torch.Tensor:
    """``(num_nodes,)`` table on ``device`` giving ``hot_ids[k]`` logical slot ``k`` and every other id -1.

    int32 while the slots fit, else int64.
    """
    index_dtype = torch.int32 if hot_ids.numel() < 2**31 else torch.int64
    table = torch.full((num_nodes,), -1, dtype=index_dtype, device=device)
    table[hot_ids.to(device=device, dtype=torch.int64)] = torch.arange(
        hot_ids.numel(), dtype=index_dtype, device=device
    )
    return table
