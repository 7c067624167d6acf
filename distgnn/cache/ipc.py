"""A clique cache over processes: each GPU's process holds one shard and maps its peers' shards by CUDA IPC.

With one trainer process per GPU (DDP), the clique policy needs every process to read the other GPUs'
shards. Each process exports a 72-byte handle of its shard (CUDA IPC handle + byte offset), the group
all-gathers the handles as uint8 tensors (no pickle), and each process opens its peers' handles.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from distgnn.cache.feature_cache import FeatureCache, slot_table
from distgnn.cache.tiers import check_rows
from distgnn.errors import InputError
from distgnn.native.cuda import gather_kernels

IPC_HANDLE_BYTES = 64
SHARED_HANDLE_BYTES = IPC_HANDLE_BYTES + 8  # handle, then the byte offset (little-endian int64)


def export_shard(shard: torch.Tensor) -> bytes:
    """The handle another process passes to :func:`open_shard` (the shard must stay alive meanwhile)."""
    handle, offset = gather_kernels().ipc_export(shard)
    return bytes(handle) + offset.to_bytes(8, "little")


def open_shard(blob: bytes, rows: int, width: int, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """Maps a peer process's shard, ``(rows, width)`` of ``dtype``, for reading from ``device``."""
    if len(blob) != SHARED_HANDLE_BYTES:
        raise InputError(f"a shared shard handle has {SHARED_HANDLE_BYTES} bytes, got {len(blob)}")
    device = torch.device(device)
    nbytes = rows * width * dtype.itemsize
    offset = int.from_bytes(blob[IPC_HANDLE_BYTES:], "little")
    raw = gather_kernels().ipc_open(blob[:IPC_HANDLE_BYTES], offset, nbytes, device.index or 0)
    return raw.view(dtype).view(rows, width)


def clique_over_processes(
    hot_ids: torch.Tensor,
    rows: torch.Tensor | Callable[[torch.Tensor], torch.Tensor],
    num_nodes: int,
    rank: int,
    world_size: int,
    device: torch.device | str,
    group: torch.distributed.ProcessGroup | None = None,
) -> FeatureCache:
    """This process's view of a clique cache whose shard ``rank`` lives on ``device``; a collective call.

    Every process of ``group`` (one per GPU, ``world_size`` of them) calls it with the same ``hot_ids``
    (hottest first) and ``rows``: ``rows[k]`` = features of ``hot_ids[k]``, or a function that returns the
    rows of the ids it is given (called once, with this process's share of ``hot_ids``, so each process
    fetches only its own shard). Each copies only its own shard (slots ``rank, rank + world_size, ...``) to
    its GPU. Keep the returned cache alive on every process until all are done reading (a barrier before
    teardown).
    """
    import torch.distributed as dist

    hot_ids = torch.as_tensor(hot_ids, dtype=torch.int64).cpu()
    device = torch.device(device)
    if callable(rows):
        own = rows(hot_ids[rank::world_size])
        check_rows(own, "cache rows")
        if own.shape[0] != len(range(rank, hot_ids.shape[0], world_size)):
            raise InputError(f"the rows function returned {own.shape[0]} rows for this process's shard of the hot ids")
    else:
        check_rows(rows, "cache rows")
        if rows.shape[0] != hot_ids.shape[0]:
            raise InputError(f"{hot_ids.shape[0]} hot ids for {rows.shape[0]} rows; give one row per id")
        own = rows[rank::world_size]
    shard = own.to(device).contiguous()
    blob = export_shard(shard) if shard.numel() else bytes(SHARED_HANDLE_BYTES)
    mine = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    if dist.get_backend(group) == "nccl":
        mine = mine.to(device)
    handles = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(handles, mine, group=group)
    shards = []
    for peer, handle in enumerate(handles):
        peer_rows = len(range(peer, hot_ids.shape[0], world_size))
        if peer == rank:
            shards.append(shard)
        elif peer_rows == 0:
            shards.append(torch.empty((0, shard.shape[1]), dtype=shard.dtype, device=device))
        else:
            shards.append(open_shard(bytes(handle.cpu().tolist()), peer_rows, shard.shape[1], shard.dtype, device))
    return FeatureCache(shards, slot_table(hot_ids, num_nodes, device), local_rank=rank)
