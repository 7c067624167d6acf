"""``node_split`` / ``edge_split``: which of a mask's nodes (edges) each trainer trains on."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from distgnn.client.context import DistContext, get_context
from distgnn.client.tensor import DistTensor
from distgnn.errors import InputError
from distgnn.partition.book import RangePartitionBook

log = logging.getLogger(__name__)


def _full_mask(mask: Any, num_nodes: int, what: str = "node") -> np.ndarray:
    if isinstance(mask, DistTensor):
        mask = mask[torch.arange(num_nodes)]
    if isinstance(mask, torch.Tensor):
        mask = mask.detach().cpu().numpy()
    mask = np.asarray(mask)
    if mask.shape != (num_nodes,):
        raise InputError(f"mask must have one entry per {what} ({num_nodes},), got shape {mask.shape}")
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


def edge_split(
    mask: Any,
    partition_book: RangePartitionBook,
    force_even: bool = True,
    rank: int | None = None,
    world_size: int | None = None,
    context: DistContext | None = None,
    etype: str | tuple[str, str, str] | None = None,
) -> torch.Tensor:
    """The global ids of ``mask``'s edges that trainer ``rank`` of ``world_size`` trains on.

    An edge belongs to the machine of its destination node; a trainer whose seed edges are local
    finds their endpoints in shared memory.

    Args:
        mask: ``(num_edges,)`` bool-like (a ``DistTensor`` such as ``g.edata["train_mask"]``, a torch
            tensor or a numpy array); with ``etype`` one entry per edge of that type.
        partition_book: the graph's partition book.
        force_even: every trainer gets exactly ``len(edges) // world_size`` edges, its own machine's
            first: each machine's selected edges are cut into equal consecutive chunks for its trainers,
            and what a chunk holds beyond a share fills, in id order, the shares of trainers whose
            chunk has too few. The fewer than ``world_size`` left-over edges are not assigned.
            Trainers are grouped by machine in rank order (``rank // (world_size // num_machines)``);
            when ``world_size`` is no multiple of the machine count, the sorted ids are cut into equal
            consecutive chunks instead. Otherwise (``force_even=False``) each trainer gets an equal
            share of the selected edges its machine owns (counts then differ between machines).
        rank, world_size: default to the context's.
        etype: split edges of this type (of a heterogeneous graph), shared out as their homogeneous ids
            are; the result is per-type ids.
    Returns:
        ``(n,)`` int64 sorted global edge ids (per-type ids with ``etype``).
    """
    if rank is None or world_size is None:
        ctx = context or get_context()
        rank = ctx.rank if rank is None else rank
        world_size = ctx.world_size if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise InputError(f"rank {rank} out of range for world size {world_size}")
    if etype is None:
        eids = np.flatnonzero(_full_mask(mask, partition_book.num_edges, "edge")).astype(np.int64)
    else:
        count = int(partition_book.edges.type_counts[partition_book.etype_id(etype)])
        per_type = np.flatnonzero(_full_mask(mask, count, f"edge of type {etype}")).astype(np.int64)
        eids = np.sort(partition_book.map_to_homo_eid(per_type, etype))
    mine = _edge_share(eids, partition_book, force_even, rank, world_size)
    return torch.from_numpy(mine if etype is None else partition_book.map_to_per_etype(mine)[1])


def _edge_share(
    eids: np.ndarray, partition_book: RangePartitionBook, force_even: bool, rank: int, world_size: int
) -> np.ndarray:
    """Trainer ``rank``'s share of the sorted homogeneous ``eids`` (see :func:`edge_split`), a new array."""
    num_parts = partition_book.num_partitions
    if not force_even:
        if world_size % num_parts:
            raise InputError(
                f"force_even=False needs the same trainer count per machine; {world_size} trainers, {num_parts} machines"
            )
        per_machine = world_size // num_parts
        start, end = partition_book.edge_range(rank // per_machine)
        mine = eids[(eids >= start) & (eids < end)]
        return np.array_split(mine, per_machine)[rank % per_machine].copy()
    share = len(eids) // world_size
    if world_size % num_parts:
        return eids[rank * share : (rank + 1) * share].copy()
    return _local_first_share(eids, partition_book.edge_map[:, 1], share, rank, world_size)


def _local_first_share(ids: np.ndarray, range_ends: np.ndarray, share: int, rank: int, world_size: int) -> np.ndarray:
    """Trainer ``rank``'s ``share`` of the sorted ``ids``: its machine's own ids first, then the surplus pool."""
    num_parts = len(range_ends)
    per_machine = world_size // num_parts
    bounds = np.searchsorted(ids, np.concatenate([[0], range_ends]))
    own: list[np.ndarray] = []  # each rank's local part of its share
    surplus: list[np.ndarray] = []
    for machine in range(num_parts):
        for chunk in np.array_split(ids[bounds[machine] : bounds[machine + 1]], per_machine):
            own.append(chunk[:share])
            surplus.append(chunk[share:])
    pool = np.concatenate(surplus)
    # Deficits are filled from the pool in rank order, so every trainer computes the same assignment.
    deficits = np.array([share - len(part) for part in own], dtype=np.int64)
    start = int(deficits[:rank].sum())
    taken = pool[start : start + int(deficits[rank])]
    return np.sort(np.concatenate([own[rank], taken]))
