"""Reshuffle node and edge ids so every partition owns contiguous ranges, and cut
the per-partition CSC with its HALO nodes.

New node ids order nodes by (partition, original id); original ids of a
heterogeneous graph number node types one after the other, so that order is
(partition, node type, original per-type id). An edge belongs to its
destination's partition. With one edge type, new edge ids order edges by (new
destination id, original edge id), which is per-partition CSC order, so
partition ``i``'s ``eids`` equal its range ``edge_map[i]``. With several, new
edge ids order edges by (partition, edge type, new destination, original id), so
every (partition, edge type) owns a contiguous range, and each partition's CSC
orders its edges by (destination, edge type) with ``eids`` naming each
position's edge: the in-edges of type ``t`` of owned node ``v`` are positions
``indptr[v*R + t] .. indptr[v*R + t + 1]`` (``R`` edge types), and all of
``v``'s in-edges are ``indptr[v*R] .. indptr[(v+1)*R]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from distgnn.partition.assign import unique_sorted
from distgnn.partition.threads import Workers


@dataclass
class Reshuffled:
    """Global id maps and the whole graph's CSC in new ids.

    Attributes:
        orig_nid: ``(N,)`` int64, original id of each new node id.
        orig_eid: ``(E,)`` int64, original id of each new edge id.
        node_map, edge_map: ``(K, 2)`` int64 ``[start, end)`` ranges per partition.
        indptr: ``(N+1,)`` int64 CSC offsets over new node ids (in-edges); one edge type only.
        src: ``(E,)`` int64 new source id of each new edge id.
        dst, etype: ``(E,)`` new destination and edge type id of each new edge id; several edge types only.
        num_etypes: R.
    """

    orig_nid: np.ndarray
    orig_eid: np.ndarray
    node_map: np.ndarray
    edge_map: np.ndarray
    indptr: np.ndarray | None
    src: np.ndarray
    dst: np.ndarray | None = None
    etype: np.ndarray | None = None
    num_etypes: int = 1


@dataclass
class LocalPartition:
    """One partition's CSC in local ids. ``indices`` int32 when the local ids fit; ``eids`` the
    global edge id of each position."""

    indptr: np.ndarray
    indices: np.ndarray
    local2global: np.ndarray
    num_owned: int
    eids: np.ndarray

    @property
    def num_halo(self) -> int:
        return int(self.local2global.shape[0]) - self.num_owned


def _ranges(sizes: np.ndarray) -> np.ndarray:
    ends = np.cumsum(sizes, dtype=np.int64)
    return np.stack([ends - sizes, ends], axis=1)


_CHUNK = 1 << 22


def stable_order(keys: np.ndarray, key_bound: int, workers: Workers | None = None) -> np.ndarray:
    """``argsort(keys, kind="stable")`` for int64 keys in ``[0, key_bound)``; consumes ``keys`` (drop it
    after the call: on more than two threads the order is a new array).

    Packs (key, position) into one int64 in place and sorts values, which numpy
    does with SIMD and an order of magnitude faster than a stable argsort; with
    ``workers``, on its threads (the same result).
    """
    return _stable_order(keys, key_bound, workers, False)[0]


def stable_order_starts(
    keys: np.ndarray, key_bound: int, workers: Workers | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`stable_order` and where each key's run begins in it: ``(order, starts)``, ``starts`` ``(key_bound
    + 1,)`` int64 (a CSR's indptr when the keys are rows), found in the sorted keys."""
    return _stable_order(keys, key_bound, workers, True)


def _stable_order(
    keys: np.ndarray, key_bound: int, workers: Workers | None, want_starts: bool
) -> tuple[np.ndarray, np.ndarray | None]:
    n = keys.shape[0]
    bits = max(int(n - 1).bit_length(), 1)
    if key_bound.bit_length() + bits > 62:
        starts = None
        if want_starts:
            starts = np.zeros(key_bound + 1, dtype=np.int64)
            np.cumsum(np.bincount(keys, minlength=key_bound), out=starts[1:])
        return np.argsort(keys, kind="stable"), starts
    workers = workers or Workers(1)

    def pack(r: tuple[int, int]) -> None:
        np.left_shift(keys[r[0] : r[1]], bits, out=keys[r[0] : r[1]])
        for start in range(r[0], r[1], _CHUNK):
            keys[start : min(start + _CHUNK, r[1])] |= np.arange(start, min(start + _CHUNK, r[1]), dtype=np.int64)

    workers.run(pack, workers.pieces(n))
    keys = workers.sort(keys)
    starts = None
    if want_starts:  # the first packed value of key k is at least k << bits
        starts = np.empty(key_bound + 1, dtype=np.int64)

        def find(r: tuple[int, int]) -> None:
            bounds = np.arange(r[0], r[1], dtype=np.int64) << bits
            starts[r[0] : r[1]] = np.searchsorted(keys, bounds)

        workers.run(find, workers.pieces(key_bound + 1))
    workers.run(lambda r: np.bitwise_and(keys[r[0] : r[1]], (1 << bits) - 1, out=keys[r[0] : r[1]]), workers.pieces(n))
    return keys, starts


def distinct_with_index(
    values: np.ndarray, bound: int | None = None, workers: Workers | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(sorted distinct values as int64, index of each value among them)`` of non-negative integer
    ``values``: by marking a table of ``bound`` entries (every value below it) where that table is small
    beside the values (the index then int32 where it fits), else by one sort (int64 index); with
    ``workers``, the marks and lookups on its threads."""
    workers = workers or Workers(1)
    if bound is not None and bound <= 4 * values.shape[0]:
        seen = np.zeros(bound, dtype=bool)

        def mark(r: tuple[int, int]) -> None:
            seen[values[r[0] : r[1]]] = True  # every thread writes the same value

        workers.run(mark, workers.pieces(values.shape[0]))
        distinct = np.flatnonzero(seen)
        del seen
        where = np.empty(bound, dtype=np.int32 if distinct.shape[0] <= np.iinfo(np.int32).max else np.int64)

        def number(r: tuple[int, int]) -> None:
            where[distinct[r[0] : r[1]]] = np.arange(r[0], r[1], dtype=where.dtype)

        workers.run(number, workers.pieces(distinct.shape[0]))
        return distinct, workers.gather(where, values)
    values = values.astype(np.int64, copy=False)
    order = stable_order(values.copy(), int(values.max(initial=0)) + 1, workers)
    ordered = values[order]
    first = np.empty(len(ordered), dtype=bool)
    first[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    index = np.empty(len(values), dtype=np.int64)
    index[order] = np.cumsum(first) - 1
    return ordered[first], index


def local_indices(
    srcs: np.ndarray, n0: int, n1: int, bound: int, workers: Workers | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """A partition's CSC indices in local ids from the sources' global ids ``srcs`` (non-negative, below
    ``bound``) of the partition that owns ``[n0, n1)``: ``(halo, indices)``, the halo's global ids sorted
    (local ids ``n1 - n0 ..``) and each source's local id (owned ``n - n0``), int32 where every local id fits.
    With ``workers``, a piece of the sources per thread (each piece's halo sources after those of the pieces
    before it)."""
    workers = workers or Workers(1)
    pieces = workers.pieces(srcs.shape[0])
    # each piece's halo sources, marked once (one byte a source, as a single mask would take)
    masks = workers.run(lambda r: (srcs[r[0] : r[1]] < n0) | (srcs[r[0] : r[1]] >= n1), pieces)
    firsts = np.zeros(len(pieces) + 1, dtype=np.int64)
    np.cumsum([int(np.count_nonzero(m)) for m in masks], out=firsts[1:])
    remote = np.empty(int(firsts[-1]), dtype=srcs.dtype)

    def take_remote(i: int, remote: np.ndarray = remote) -> None:
        lo, hi = pieces[i]
        np.compress(masks[i], srcs[lo:hi], out=remote[firsts[i] : firsts[i + 1]])

    workers.run(take_remote, list(range(len(pieces))))
    halo, halo_index = distinct_with_index(remote, bound=bound, workers=workers)
    del remote, take_remote
    num_owned = n1 - n0
    index_dtype = np.int32 if num_owned + halo.shape[0] <= np.iinfo(np.int32).max else np.int64
    halo_index = halo_index.astype(index_dtype, copy=False)
    # (in place, no temporaries: the halo's local ids, then each piece's)
    workers.run(
        lambda r: np.add(halo_index[r[0] : r[1]], num_owned, out=halo_index[r[0] : r[1]]),
        workers.pieces(len(halo_index)),
    )
    indices = np.empty(srcs.shape[0], dtype=index_dtype)

    def local_ids(i: int) -> None:
        lo, hi = pieces[i]
        out = indices[lo:hi]
        np.subtract(srcs[lo:hi], n0, out=out, casting="unsafe")
        out[masks[i]] = halo_index[firsts[i] : firsts[i + 1]]

    workers.run(local_ids, list(range(len(pieces))))
    return halo, indices


def reshuffle(num_nodes: int, src: np.ndarray, dst: np.ndarray, part: np.ndarray, num_parts: int) -> Reshuffled:
    """New ids for the assignment ``part`` (``(N,)`` int64 in ``[0, num_parts)``)."""
    orig_nid = stable_order(part.astype(np.int64, copy=True), num_parts)
    node_map = _ranges(np.bincount(part, minlength=num_parts))
    old2new = np.empty(num_nodes, dtype=np.int64)
    old2new[orig_nid] = np.arange(num_nodes, dtype=np.int64)

    new_dst = old2new[dst]
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(new_dst, minlength=num_nodes), out=indptr[1:])
    orig_eid = stable_order(new_dst, num_nodes)  # reuses new_dst's memory
    new_src = src[orig_eid]
    for start in range(0, new_src.shape[0], _CHUNK):  # in chunks: take(out=) on its own input copies it whole
        new_src[start : start + _CHUNK] = old2new[new_src[start : start + _CHUNK]]
    edge_map = np.stack([indptr[node_map[:, 0]], indptr[node_map[:, 1]]], axis=1)
    return Reshuffled(orig_nid, orig_eid, node_map, edge_map, indptr, new_src)


def reshuffle_typed(
    num_nodes: int,
    src: np.ndarray,
    dst: np.ndarray,
    etype: np.ndarray,
    num_etypes: int,
    part: np.ndarray,
    num_parts: int,
) -> Reshuffled:
    """New ids for several edge types: ``etype`` ``(E,)`` int edge type id per original edge."""
    orig_nid = stable_order(part.astype(np.int64, copy=True), num_parts)
    node_map = _ranges(np.bincount(part, minlength=num_parts))
    old2new = np.empty(num_nodes, dtype=np.int64)
    old2new[orig_nid] = np.arange(num_nodes, dtype=np.int64)
    group = part[dst] * num_etypes + etype  # (partition, edge type) of each edge
    counts = np.bincount(group, minlength=num_parts * num_etypes).reshape(num_parts, num_etypes)
    key = group * num_nodes
    key += old2new[dst]
    del group
    orig_eid = stable_order(key, num_parts * num_etypes * num_nodes)
    new_src = old2new[src[orig_eid]]
    new_dst = old2new[dst[orig_eid]]
    new_etype = etype[orig_eid]
    edge_map = _ranges(counts.sum(axis=1))
    return Reshuffled(orig_nid, orig_eid, node_map, edge_map, None, new_src, new_dst, new_etype, num_etypes)


def edge_type_ranges(r: Reshuffled) -> np.ndarray:
    """``(P, R, 2)`` homogeneous edge id ranges per (partition, edge type)."""
    num_parts = r.node_map.shape[0]
    if r.etype is None:
        return r.edge_map[:, None, :].copy()
    part = np.searchsorted(r.edge_map[:, 1], np.arange(r.src.shape[0]), side="right")
    counts = np.bincount(part * r.num_etypes + r.etype, minlength=num_parts * r.num_etypes)
    return _ranges(counts).reshape(num_parts, r.num_etypes, 2)


def _in_neighbours(r: Reshuffled, nodes: np.ndarray) -> np.ndarray:
    """New source ids of every in-edge of ``nodes`` (concatenated)."""
    starts = r.indptr[nodes]
    counts = r.indptr[nodes + 1] - starts
    offsets = np.cumsum(counts) - counts
    positions = np.repeat(starts - offsets, counts) + np.arange(int(counts.sum()), dtype=np.int64)
    return r.src[positions]


def local_partition(r: Reshuffled, part_id: int, halo_hops: int, scratch: np.ndarray) -> LocalPartition:
    """Partition ``part_id``'s CSC in local ids.

    HALO nodes are every non-owned node within ``halo_hops`` in-hops of an owned
    node, hop 1 first, each hop sorted by global id. ``scratch`` is an ``(N,)``
    int64 array reused across calls (only entries of this partition's HALO nodes
    are written before they are read).
    """
    n0, n1 = (int(x) for x in r.node_map[part_id])
    e0, e1 = (int(x) for x in r.edge_map[part_id])
    num_owned = n1 - n0
    srcs = r.src[e0:e1]
    eids = np.arange(e0, e1, dtype=np.int64)
    if r.etype is None:
        indptr = r.indptr[n0 : n1 + 1] - e0
    else:
        rows = (r.dst[e0:e1] - n0) * r.num_etypes + r.etype[e0:e1]  # (destination, edge type) of each edge
        order = np.argsort(rows, kind="stable")
        indptr = np.zeros(num_owned * r.num_etypes + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=num_owned * r.num_etypes), out=indptr[1:])
        srcs, eids = srcs[order], eids[order]
    remote = (srcs < n0) | (srcs >= n1)
    halo = [unique_sorted(srcs[remote])]
    if halo_hops > 1:
        if r.indptr is None:
            raise ValueError("halo_hops > 1 needs the one-edge-type CSC")
        seen = np.zeros(scratch.shape[0], dtype=bool)
        seen[n0:n1] = True
        seen[halo[0]] = True
        for _ in range(halo_hops - 1):
            found = _in_neighbours(r, halo[-1])
            found = unique_sorted(found[~seen[found]])
            if not found.size:
                break
            seen[found] = True
            halo.append(found)
    local2global = np.concatenate([np.arange(n0, n1, dtype=np.int64), *halo])
    num_local = local2global.shape[0]
    scratch[local2global[num_owned:]] = np.arange(num_owned, num_local, dtype=np.int64)
    index_dtype = np.int32 if num_local <= np.iinfo(np.int32).max else np.int64
    indices = (srcs - n0).astype(index_dtype)
    indices[remote] = scratch[srcs[remote]]
    return LocalPartition(indptr, indices, local2global, num_owned, eids)
