"""Reshuffle node and edge ids so every partition owns contiguous ranges, and cut
the per-partition CSC with its HALO nodes.

New node ids order nodes by (partition, original id). An edge belongs to its
destination's partition; new edge ids order edges by (new destination id,
original edge id), which is per-partition CSC order, so partition ``i``'s edges
are the contiguous range ``edge_map[i]`` and its ``eids`` equal that range.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from distgnn.partition.assign import unique_sorted


@dataclass
class Reshuffled:
    """Global id maps and the whole graph's CSC in new ids.

    Attributes:
        orig_nid: ``(N,)`` int64, original id of each new node id.
        orig_eid: ``(E,)`` int64, original id of each new edge id.
        node_map, edge_map: ``(K, 2)`` int64 ``[start, end)`` ranges per partition.
        indptr: ``(N+1,)`` int64 CSC offsets over new node ids (in-edges).
        src: ``(E,)`` int64 new source id of each new edge id.
    """

    orig_nid: np.ndarray
    orig_eid: np.ndarray
    node_map: np.ndarray
    edge_map: np.ndarray
    indptr: np.ndarray
    src: np.ndarray


@dataclass
class LocalPartition:
    """One partition's CSC in local ids. ``indices`` int32 when the local ids fit."""

    indptr: np.ndarray
    indices: np.ndarray
    local2global: np.ndarray
    num_owned: int

    @property
    def num_halo(self) -> int:
        return int(self.local2global.shape[0]) - self.num_owned


def _ranges(sizes: np.ndarray) -> np.ndarray:
    ends = np.cumsum(sizes, dtype=np.int64)
    return np.stack([ends - sizes, ends], axis=1)


_CHUNK = 1 << 22


def _stable_order(keys: np.ndarray, key_bound: int) -> np.ndarray:
    """``argsort(keys, kind="stable")`` for int64 keys in ``[0, key_bound)``; consumes ``keys``.

    Packs (key, position) into one int64 in place and sorts values, which numpy
    does with SIMD and an order of magnitude faster than a stable argsort.
    """
    n = keys.shape[0]
    bits = max(int(n - 1).bit_length(), 1)
    if key_bound.bit_length() + bits > 62:
        return np.argsort(keys, kind="stable")
    np.left_shift(keys, bits, out=keys)
    for start in range(0, n, _CHUNK):
        keys[start : start + _CHUNK] |= np.arange(start, min(start + _CHUNK, n), dtype=np.int64)
    keys.sort()
    np.bitwise_and(keys, (1 << bits) - 1, out=keys)
    return keys


def reshuffle(num_nodes: int, src: np.ndarray, dst: np.ndarray, part: np.ndarray, num_parts: int) -> Reshuffled:
    """New ids for the assignment ``part`` (``(N,)`` int64 in ``[0, num_parts)``)."""
    orig_nid = _stable_order(part.astype(np.int64, copy=True), num_parts)
    node_map = _ranges(np.bincount(part, minlength=num_parts))
    old2new = np.empty(num_nodes, dtype=np.int64)
    old2new[orig_nid] = np.arange(num_nodes, dtype=np.int64)

    new_dst = old2new[dst]
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(new_dst, minlength=num_nodes), out=indptr[1:])
    orig_eid = _stable_order(new_dst, num_nodes)  # reuses new_dst's memory
    new_src = src[orig_eid]
    for start in range(0, new_src.shape[0], _CHUNK):  # in chunks: take(out=) on its own input copies it whole
        new_src[start : start + _CHUNK] = old2new[new_src[start : start + _CHUNK]]
    edge_map = np.stack([indptr[node_map[:, 0]], indptr[node_map[:, 1]]], axis=1)
    return Reshuffled(orig_nid, orig_eid, node_map, edge_map, indptr, new_src)


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
    remote = (srcs < n0) | (srcs >= n1)
    halo = [unique_sorted(srcs[remote])]
    if halo_hops > 1:
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
    indptr = r.indptr[n0 : n1 + 1] - e0
    return LocalPartition(indptr, indices, local2global, num_owned)
