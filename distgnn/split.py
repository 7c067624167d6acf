"""``node_split``: which of a mask's nodes each trainer trains on."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from distgnn.context import DistContext, get_context
from distgnn.errors import InputError
from distgnn.partition_book import RangePartitionBook
from distgnn.tensor import DistTensor

log = logging.getLogger(__name__)


def _full_mask(mask: Any, num_nodes: int) -> np.ndarray:
    if isinstance(mask, DistTensor):
        mask = mask[torch.arange(num_nodes)]
    if isinstance(mask, torch.Tensor):
        mask = mask.detach().cpu().numpy()
    mask = np.asarray(mask)
    if mask.shape != (num_nodes,):
        raise InputError(f"mask must have one entry per node ({num_nodes},), got shape {mask.shape}")
    return mask.astype(bool, copy=False)


def node_split(
    mask: Any,
    partition_book: RangePartitionBook,
    force_even: bool = True,
    rank: int | None = None,
    world_size: int | None = None,
    context: DistContext | None = None,
    ntype: str | None = None,
) -> torch.Tensor:
    """The global ids of ``mask``'s nodes that trainer ``rank`` of ``world_size`` trains on.

    Args:
        mask: ``(num_nodes,)`` bool-like (a ``DistTensor``, torch tensor or numpy array); with ``ntype``
            one entry per node of that type.
        ntype: split nodes of this type (of a heterogeneous graph); the result is per-type ids.
        partition_book: the graph's partition book.
        force_even: every trainer gets exactly ``len(nodes) // world_size`` nodes: the sorted
            selected ids cut into equal consecutive chunks. Ids are grouped by partition, so with
            balanced partitions a trainer's chunk lies (mostly) in its own machine's partition.
            The fewer than ``world_size`` left-over nodes are not assigned.
            Otherwise each trainer gets an equal share of the selected nodes its machine owns
            (counts then differ between machines).
        rank, world_size: default to the context's.
    Returns:
        ``(n,)`` int64 sorted global node ids (per-type ids with ``ntype``).
    """
    if rank is None or world_size is None:
        ctx = context or get_context()
        rank = ctx.rank if rank is None else rank
        world_size = ctx.world_size if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise InputError(f"rank {rank} out of range for world size {world_size}")
    if ntype is None:
        count = partition_book.num_nodes
    else:
        count = int(partition_book.nodes.type_counts[partition_book.ntype_id(ntype)])
    nids = np.flatnonzero(_full_mask(mask, count)).astype(np.int64)
    if force_even:
        share = len(nids) // world_size
        if len(nids) % world_size:
            log.debug("node_split: %d of %d nodes left unassigned for equal shares", len(nids) % world_size, len(nids))
        return torch.from_numpy(nids[rank * share : (rank + 1) * share].copy())
    num_parts = partition_book.num_partitions
    if world_size % num_parts:
        raise InputError(
            f"force_even=False needs the same trainer count per machine; {world_size} trainers, {num_parts} machines"
        )
    per_machine = world_size // num_parts
    owned = partition_book.partid2nids(rank // per_machine, ntype)
    start, end = (int(owned[0]), int(owned[-1]) + 1) if len(owned) else (0, 0)
    mine = nids[(nids >= start) & (nids < end)]
    return torch.from_numpy(np.array_split(mine, per_machine)[rank % per_machine].copy())
