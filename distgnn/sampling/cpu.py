"""The CPU sampling backend: the C++ kernels and one distributed layer over numpy arrays.

The ops (:func:`sample_neighbors` and :func:`take`, defined torch-free in :mod:`distgnn.sampling.kernels`, and
:func:`to_block`) run in the multi-threaded C++ extension ``distgnn._cpu_kernels`` (built at install time, or once
on first use, see :mod:`distgnn.native.cpu`); :mod:`distgnn.sampling.reference` holds plain numpy versions with
the same semantics. Inputs are numpy arrays on a CSC graph (the in-edges of each node), such as a partition's
``indptr``/``indices`` in shared memory; they are read in place, never copied. :class:`CpuSampling` is the backend
:class:`~distgnn.sampling.neighbor.NeighborSampler` picks without a device: per layer, seeds split by owner, remote
owners' seeds sent as ``sample`` requests first, this machine's sampled while they are in flight, replies merged
into seed order and relabelled into a Block.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch

from distgnn.errors import InputError
from distgnn.native.cpu import extension
from distgnn.partition.book import RangePartitionBook
from distgnn.sampling.block import Block
from distgnn.sampling.items import layer_items, sample_layers
from distgnn.sampling.kernels import as_int64_ids, sample_neighbors, take
from distgnn.sampling.source import LocalCSC, RemoteSampling, SampleRequest, as_node_ids


class CpuSampling:
    """The CPU backend of :class:`~distgnn.sampling.neighbor.NeighborSampler`: numpy frontiers, C++ kernels,
    blocks of CPU tensors."""

    device = None

    def frontier(self, book: RangePartitionBook, seeds: torch.Tensor | np.ndarray) -> np.ndarray:
        """The output nodes as the first layer's frontier: a 1-D int64 array (checked when sampled)."""
        return as_node_ids(seeds)

    def layers(
        self,
        book: RangePartitionBook,
        local: LocalCSC,
        remote: RemoteSampling | None,
        frontier: np.ndarray,
        layers: Sequence[tuple[int | dict, Sequence[int]]],
        replace: bool,
        prob: str | None,
    ) -> tuple[list[Block], np.ndarray]:
        """The Blocks of ``layers`` (``(fanout, part_seeds)`` each, output layer first) over ``frontier``, one
        at a time, and the last one's source nodes."""
        return sample_layers(
            lambda front, fanout, part_seeds: self.layer(book, local, remote, front, fanout, replace, prob, part_seeds),
            frontier,
            layers,
        )

    def layer(
        self,
        book: RangePartitionBook,
        local: LocalCSC,
        remote: RemoteSampling | None,
        frontier: np.ndarray,
        fanout: int | dict,
        replace: bool,
        prob: str | None,
        part_seeds: Sequence[int],
    ) -> tuple[Block, np.ndarray]:
        """One layer's Block over ``frontier`` and the next frontier (its source nodes)."""
        items = layer_items(book, fanout, frontier)
        seeds = frontier if items.pos is None else frontier[items.pos]
        counts, src, eids = sample_layer(
            book, local, remote, seeds, items.fanout, replace, prob, part_seeds, items.etype
        )
        if items.pos is None:
            block = to_block(frontier, counts, src, eids)
        else:
            seed_counts = np.bincount(items.pos, weights=counts, minlength=len(frontier)).astype(np.int64)
            block = to_block(frontier, seed_counts, src, eids)
            src_ntypes, _ = book.map_to_per_ntype(block.src_nids)
            block = dataclasses.replace(
                block, etypes=torch.from_numpy(np.repeat(items.etype, counts)), src_ntypes=src_ntypes
            )
        return block, block.src_nids.numpy()

    def close(self) -> None:
        """Nothing is held."""


def sample_layer(
    book: RangePartitionBook,
    local: LocalCSC,
    remote: RemoteSampling | None,
    seeds: np.ndarray,
    fanout: int | list[int],
    replace: bool,
    prob: str | None,
    part_seeds: Sequence[int],
    etypes: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One layer over the whole cluster: ``(counts, src global ids, edge ids)`` in seed order.

    ``part_seeds[p]`` seeds the random stream of machine ``p``'s seeds, so results do not depend on the
    batching. With ``etypes`` the seeds are typed items (a node may repeat, once per edge type) and
    ``fanout`` lists one fanout per edge type.
    """
    owners = np.full(len(seeds), local.part_id, dtype=np.int64) if local.replicated else book.nid2partid(seeds)
    local_where = None
    remote_wheres: list[np.ndarray] = []  # positions in `seeds` of each remote owner's seeds
    handles = []
    for part in np.unique(owners).tolist():
        where = np.flatnonzero(owners == part)
        if part == local.part_id:
            local_where = where
            continue
        if remote is None:
            raise InputError(f"seed owned by partition {part} but this graph has no remote access")
        part_etypes = None if etypes is None else etypes[where]
        request = SampleRequest(seeds[where], fanout, replace, prob, part_seeds[part], part_etypes)
        handles.append(remote.send_sample(part, request))
        remote_wheres.append(where)
    wheres, results = [], []
    if local_where is not None:
        wheres.append(local_where)
        local_etypes = None if etypes is None else etypes[local_where]
        request = SampleRequest(seeds[local_where], fanout, replace, prob, part_seeds[local.part_id], local_etypes)
        results.append(sample_local(local, request))
    if handles:
        wheres.extend(remote_wheres)
        results.extend(remote.wait_sample(handles))
    return merge(len(seeds), wheres, results)


def sample_local(local: LocalCSC, request: SampleRequest) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The local partition's picks for ``request`` (its seeds owned here): ``(counts, src global ids, edge ids)``."""
    seeds, fanout, prob, etypes = request.seeds, request.fanout, request.prob, request.etypes
    weights = None
    if prob is not None:
        if prob not in local.edge_weights:
            raise InputError(f"no edge array {prob!r} to sample by (have {sorted(local.edge_weights)})")
        weights = local.edge_weights[prob]
    # An explicit thread count matters beyond speed: with the default (None) the kernel turns on
    # OpenMP dynamic teams for the calling thread, and torch's parallel CPU kernels that split work
    # by the requested team size (the CSR product among them) then silently skip chunks.
    threads = torch.get_num_threads()
    if etypes is not None:
        fanout = np.asarray(fanout, dtype=np.int64)[etypes]
    counts, positions, neighbors = sample_neighbors(
        local.indptr,
        local.indices,
        local.rows(seeds, etypes),
        fanout,
        request.replace,
        weights,
        request.rng_seed,
        num_threads=threads,
        return_neighbors=True,
    )
    src = take(local.local2global, neighbors, num_threads=threads)
    offset = local.eid_offset
    if offset is None:
        return counts, src, take(local.eids, positions, num_threads=threads)
    positions += offset  # edge ids in CSC order: no gather from the partition's edge-id array
    return counts, src, positions


def merge(
    num_seeds: int,
    wheres: list[np.ndarray],
    results: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scatter per-owner results (each grouped by seed in ``where`` order) into global seed order."""
    if len(wheres) == 1:
        return results[0]
    counts = np.zeros(num_seeds, dtype=np.int64)
    for where, (group_counts, _, _) in zip(wheres, results, strict=True):
        counts[where] = group_counts
    offsets = np.zeros(num_seeds + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    total = int(offsets[-1])
    src = np.empty(total, dtype=np.int64)
    eids = np.empty(total, dtype=np.int64)
    for where, (group_counts, group_src, group_eids) in zip(wheres, results, strict=True):
        # Edge k of the group, the j-th pick of seed where[i], lands at offsets[where[i]] + j.
        starts = np.zeros(len(group_counts), dtype=np.int64)
        np.cumsum(group_counts[:-1], out=starts[1:])
        target = np.repeat(offsets[where] - starts, group_counts) + np.arange(len(group_src), dtype=np.int64)
        src[target] = group_src
        eids[target] = group_eids
    return counts, src, eids


def to_block(
    dst_nids: np.ndarray,
    counts: np.ndarray,
    src_nids_per_edge: np.ndarray,
    eids: np.ndarray,
) -> Block:
    """Relabel one layer's sampled edges into a :class:`Block`.

    Args:
        dst_nids: ``(num_dst,)`` int64 unique global ids of the destination nodes (the layer's seeds).
        counts: ``(num_dst,)`` int64 sampled in-edges per destination node.
        src_nids_per_edge: ``(num_edges,)`` int64 global source id of each
            edge, grouped by destination in ``dst_nids`` order.
        eids: ``(num_edges,)`` int64 global edge ids; an int64 contiguous array
            becomes ``block.eids`` without a copy (shared memory).

    Returns:
        A block whose ``src_nids`` are ``dst_nids`` followed by the other
        sources in order of first appearance, with ``indices`` into ``src_nids``.

    Raises:
        ValueError: shapes or dtypes disagree, or ``dst_nids`` has repeats.
    """
    dst_nids = as_int64_ids(dst_nids, "dst_nids")
    src_nids_per_edge = as_int64_ids(src_nids_per_edge, "src_nids_per_edge")
    counts = as_int64_ids(counts, "counts")
    eids = as_int64_ids(eids, "eids")
    if len(counts) != len(dst_nids):
        raise ValueError(f"counts must have one entry per dst node ({len(dst_nids)}), got {len(counts)}")
    if len(eids) != len(src_nids_per_edge):
        raise ValueError(f"eids ({len(eids)}) and src_nids_per_edge ({len(src_nids_per_edge)}) must have equal length")
    indptr = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    if (len(counts) and counts.min() < 0) or indptr[-1] != len(src_nids_per_edge):
        raise ValueError(
            f"counts must be non-negative and sum to the number of edges ({len(src_nids_per_edge)}), got sum {indptr[-1]}"
        )
    src_nids, indices = extension().relabel(dst_nids, src_nids_per_edge)
    return Block(
        src_nids=torch.from_numpy(src_nids),
        num_dst=len(dst_nids),
        indptr=torch.from_numpy(indptr),
        indices=torch.from_numpy(indices),
        eids=torch.from_numpy(eids),
    )
