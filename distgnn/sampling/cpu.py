"""The CPU sampling backend: the C++ kernels and one distributed layer over numpy arrays.

The ops (:func:`sample_neighbors`, :func:`take`, :func:`to_block`) run in the multi-threaded C++ extension
``distgnn._cpu_kernels`` (built at install time, or once on first use, see :mod:`distgnn.native.cpu`);
:mod:`distgnn.sampling.reference` holds plain numpy versions with the same semantics. Inputs are numpy arrays
on a CSC graph (the in-edges of each node), such as a partition's ``indptr``/``indices`` in shared memory; they
are read in place, never copied. :class:`CpuSampling` is the backend :class:`~distgnn.sampling.neighbor.
NeighborSampler` picks without a device: per layer, seeds split by owner, remote owners' seeds sent as
``sample`` requests first, this machine's sampled while they are in flight, replies merged into seed order and
relabelled into a Block.
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
from distgnn.sampling.items import layer_items
from distgnn.sampling.source import LocalCSC, RemoteSampling, SampleRequest, as_node_ids


class CpuSampling:
    """The CPU backend of :class:`~distgnn.sampling.neighbor.NeighborSampler`: numpy frontiers, C++ kernels,
    blocks of CPU tensors."""

    device = None

    def frontier(self, book: RangePartitionBook, seeds: torch.Tensor | np.ndarray) -> np.ndarray:
        """The output nodes as the first layer's frontier: a 1-D int64 array (checked when sampled)."""
        return as_node_ids(seeds)

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


def sample_neighbors(
    indptr: np.ndarray,
    indices: np.ndarray,
    seeds: np.ndarray,
    fanout: int | np.ndarray,
    replace: bool = False,
    prob: np.ndarray | None = None,
    rng_seed: int = 0,
    num_threads: int | None = None,
    return_neighbors: bool = False,
) -> tuple[np.ndarray, ...]:
    """Pick up to ``fanout`` in-neighbours of each seed from a CSC graph.

    Without replacement a seed gets ``min(fanout, degree)`` distinct edges;
    with replacement ``fanout`` edges (none when its degree is 0); ``fanout=-1``
    takes every edge. With ``prob``, zero-weight edges are never picked and
    "degree" counts the non-zero-weight edges only; picks without replacement
    are successive weighted draws (as in DGL), with replacement independent
    draws proportional to weight.

    Args:
        indptr: ``(num_nodes + 1,)`` int64 CSC row pointer, ``indptr[-1] == len(indices)``.
        indices: ``(num_edges,)`` int32 or int64 source node of each edge position.
        seeds: ``(num_seeds,)`` integer node ids (``0 <= seed < num_nodes``), repeats allowed.
        fanout: picks per seed, ``-1`` for all; or a ``(num_seeds,)`` int64 array, one fanout per seed
            (typed sampling, where a "seed" is a row ``v * R + t`` of the typed CSC).
        replace: draw with replacement.
        prob: optional ``(num_edges,)`` float32 finite non-negative weight per edge position.
        rng_seed: seed of the random streams. Seed ``i`` draws from a stream
            keyed by ``(rng_seed, i)`` alone, so the result does not depend on
            ``num_threads``; pass a fresh ``rng_seed`` per call for fresh samples.
        num_threads: threads to use; ``None`` follows ``torch.get_num_threads()``
            (so ``torch.set_num_threads(1)`` in a worker process keeps it single-threaded).
        return_neighbors: also return ``indices[positions]`` as int64, gathered
            in parallel inside the kernel (faster than numpy's gather).

    Returns:
        ``counts``: ``(num_seeds,)`` int64 picks per seed, and ``positions``:
        ``(counts.sum(),)`` int64 positions into ``indices`` grouped by seed in
        seed order, so ``indices[positions]`` are the neighbours and
        ``eids[positions]`` the edge ids; with ``return_neighbors`` a third
        array, ``neighbors`` = ``indices[positions]`` (int64).

    Raises:
        ValueError: a dtype or shape is wrong, a seed is out of range, the
            ``indptr`` range of a seed is corrupt, or a weight is negative or not finite.
    """
    seeds = _as_int64_ids(seeds, "seeds")
    fanouts = None
    if isinstance(fanout, np.ndarray):
        fanouts, fanout = np.ascontiguousarray(fanout, dtype=np.int64), 0
    elif not isinstance(fanout, (int, np.integer)) or fanout < -1:
        raise ValueError(f"fanout must be an int >= -1 (-1 = all neighbours) or an array, got {fanout!r}")
    return extension().sample_neighbors(
        indptr,
        indices,
        seeds,
        int(fanout),
        bool(replace),
        prob,
        int(rng_seed) % 2**64,
        _thread_count(num_threads),
        bool(return_neighbors),
        fanouts,
    )


def take(values: np.ndarray, positions: np.ndarray, num_threads: int | None = None) -> np.ndarray:
    """``values[positions]`` as int64, gathered in parallel (e.g. ``eids[positions]``, ``local2global[nbrs]``).

    Args:
        values: ``(n,)`` int32 or int64 array, read in place.
        positions: ``(m,)`` integer positions, ``0 <= p < n``.
        num_threads: as in :func:`sample_neighbors`.

    Returns:
        ``(m,)`` int64.

    Raises:
        ValueError: a dtype is wrong or a position is out of range.
    """
    positions = _as_int64_ids(positions, "positions")
    return extension().take(values, positions, _thread_count(num_threads))


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
    dst_nids = _as_int64_ids(dst_nids, "dst_nids")
    src_nids_per_edge = _as_int64_ids(src_nids_per_edge, "src_nids_per_edge")
    counts = _as_int64_ids(counts, "counts")
    eids = _as_int64_ids(eids, "eids")
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


def _thread_count(num_threads: int | None) -> int:
    if num_threads is None:
        return torch.get_num_threads()
    if int(num_threads) < 1:
        raise ValueError(f"num_threads must be >= 1 or None, got {num_threads}")
    return int(num_threads)


def _as_int64_ids(ids: np.ndarray, name: str) -> np.ndarray:
    """A 1-D contiguous int64 view (or copy) of an integer array; ValueError otherwise."""
    if isinstance(ids, torch.Tensor):
        ids = ids.numpy()
    ids = np.asarray(ids)
    if ids.ndim != 1 or not (np.issubdtype(ids.dtype, np.integer) or ids.size == 0):
        raise ValueError(f"{name} must be a 1-D integer array, got dtype {ids.dtype} and shape {ids.shape}")
    return np.ascontiguousarray(ids, dtype=np.int64)
