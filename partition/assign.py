"""Node-to-partition assignment: METIS (through pymetis) or uniformly random.

METIS sees the symmetrised simple graph (both directions of every edge, no
self loops, no duplicates), as DistDGL gives it. Balance constraints are
multi-constraint vertex weights, again as DistDGL builds them: one 0/1 weight
per node group (non-train and train nodes with ``balance_train``; on a
heterogeneous graph every node type, the target type's train nodes a group of
their own, like DistDGL's ``balance_ntypes``), with ``balance_edges`` the
in-degree (per group when both are on). Arrays are int64 throughout because that is pymetis' zero-copy index type.

Several constraints (and edge weights) go through ``distgnn.partition.metis``,
since pymetis itself passes METIS only one.

Large graphs (``coarsen="auto"``) are first clustered and contracted in numpy
(``distgnn.partition.coarsen``), so METIS sees a small weighted graph.
"""

from __future__ import annotations

import logging

import numpy as np

from distgnn.errors import InputError
from distgnn.partition.coarsen import coarsened_metis
from distgnn.partition.metis import metis_kway

logger = logging.getLogger(__name__)

METHODS = ("metis", "random", "range")


def unique_sorted(values: np.ndarray, runs: bool = False) -> np.ndarray:
    """Sorted distinct values of an int array, sorting ``values`` in place; ``runs``: ``values`` is a few
    sorted runs one after the other, which the stable sort merges.

    ``np.unique`` hashes first on recent numpy, which is far slower than the SIMD
    sort at tens of millions of ids.
    """
    values.sort(kind="stable" if runs else None)
    keep = np.empty(values.shape[0], dtype=bool)
    keep[:1] = True
    np.not_equal(values[1:], values[:-1], out=keep[1:])
    return values[keep]


def symmetric_csr(num_nodes: int, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR ``(xadj (N+1,), adjncy)`` int64 of the simple undirected graph underlying the edges."""
    n = int(num_nodes)
    loops = src == dst
    if loops.any():
        src, dst = src[~loops], dst[~loops]
    del loops
    m = src.shape[0]
    keys = np.empty(2 * m, dtype=np.int64)
    np.multiply(src, n, out=keys[:m])
    keys[:m] += dst
    np.multiply(dst, n, out=keys[m:])
    keys[m:] += src
    keys = unique_sorted(keys)
    xadj = np.searchsorted(keys, np.arange(n + 1, dtype=np.int64) * n)
    np.remainder(keys, n, out=keys)
    return xadj.astype(np.int64, copy=False), keys


def _vertex_weights(
    dst: np.ndarray, num_nodes: int, groups: np.ndarray | None, balance_edges: bool
) -> np.ndarray | None:
    """``(N, ncon)`` int64 weights, or None for plain node-count balance.

    ``groups``: ``(N,)`` int group id per node (non-train/train, or node type and the target type's
    train nodes): one 0/1 constraint per group, so METIS balances every group's count per part.
    """
    columns: list[np.ndarray] = []
    masks = [groups == g for g in range(int(groups.max()) + 1)] if groups is not None and groups.size else []
    columns.extend(m.astype(np.int64) for m in masks)
    if balance_edges:
        in_degree = np.bincount(dst, minlength=num_nodes).astype(np.int64)
        columns.extend([np.where(m, in_degree, 0) for m in masks] if masks else [in_degree])
    # METIS rejects a constraint whose total weight is zero (e.g. a graph with no train nodes).
    columns = [c for c in columns if c.any()]
    if len(columns) == 1 and not balance_edges:
        return None  # one group: plain node-count balance
    if not columns:
        return None
    return np.ascontiguousarray(np.stack(columns, axis=1))


COARSEN_MODES = ("auto", "on", "off")
# "auto" coarsens when METIS would see at least this many adjacency entries.
COARSEN_MIN_ENTRIES = 2_000_000


def metis_assignment(
    num_nodes: int,
    src: np.ndarray,
    dst: np.ndarray,
    num_parts: int,
    groups: np.ndarray | None = None,
    balance_edges: bool = False,
    seed: int = 0,
    coarsen: str = "auto",
) -> tuple[np.ndarray, int]:
    """``(part (N,) int64, edge cut of the symmetrised graph)``.

    ``groups``: optional ``(N,)`` int group of each node; each group's node count is balanced.
    ``coarsen``: ``"off"`` hands the whole symmetrised graph to METIS; ``"on"``
    first clusters and contracts it in numpy (``distgnn.partition.coarsen``),
    runs METIS on the small graph and refines on the way back, which needs a
    fraction of METIS's memory; ``"auto"`` does that from
    ``COARSEN_MIN_ENTRIES`` adjacency entries on.
    """
    import pymetis

    if coarsen not in COARSEN_MODES:
        raise InputError(f"unknown coarsen mode {coarsen!r}; expected one of {', '.join(COARSEN_MODES)}")
    if num_parts == 1:
        return np.zeros(num_nodes, dtype=np.int64), 0
    xadj, adjncy = symmetric_csr(num_nodes, src, dst)
    logger.info("METIS input: %d nodes, %d adjacency entries (symmetrised)", num_nodes, adjncy.shape[0])
    vweights = _vertex_weights(dst, num_nodes, groups, balance_edges)
    if coarsen == "on" or (coarsen == "auto" and adjncy.shape[0] >= COARSEN_MIN_ENTRIES):
        if num_nodes < np.iinfo(np.int32).max:
            adjncy = adjncy.astype(np.int32)
        return coarsened_metis(xadj, adjncy, vweights, num_parts, seed)
    if vweights is not None and vweights.shape[1] > 1:
        return metis_kway(xadj, adjncy, vweights, None, num_parts, seed)
    try:
        result = pymetis.part_graph(
            num_parts,
            pymetis.CSRAdjacency(xadj, adjncy),
            vweights=None if vweights is None else vweights.reshape(-1),
            recursive=False,
            options=pymetis.Options(seed=seed),
        )
    except (RuntimeError, ValueError) as exc:
        raise InputError(f"METIS failed on {num_nodes} nodes / {num_parts} parts: {exc}") from exc
    return np.frombuffer(result.vertex_part, dtype=np.int64).copy(), int(result.edge_cuts)


_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)
_FEISTEL_ROUNDS = 4


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on ``uint64`` values (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def hash_ids(ids: np.ndarray, seed: int, salt: int = 0) -> np.ndarray:
    """A ``uint64`` hash of each id that depends only on ``(seed, salt, id)``."""
    key = _mix64(np.array([seed & 0xFFFFFFFFFFFFFFFF, salt & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))
    with np.errstate(over="ignore"):
        return _mix64(_mix64(np.asarray(ids, dtype=np.int64).astype(np.uint64) ^ key[0]) + key[1])


def permute_ids(ids: np.ndarray, num_nodes: int, seed: int) -> np.ndarray:
    """The image of ``ids`` under a pseudo-random permutation of ``[0, num_nodes)`` chosen by ``seed``.

    A balanced Feistel network over the smallest power of four covering ``num_nodes``, cycle-walked
    back into range, so each id's image is computed from the id alone (no table, any subset of ids).
    """
    ids = np.asarray(ids, dtype=np.int64)
    half_bits = max(1, (max(int(num_nodes) - 1, 1).bit_length() + 1) // 2)
    low = np.uint64((1 << half_bits) - 1)
    out = ids.astype(np.uint64)
    pending = np.arange(out.shape[0])
    values = out.copy()
    while pending.size:
        x = values[pending]
        left, right = x >> np.uint64(half_bits), x & low
        for r in range(_FEISTEL_ROUNDS):
            left, right = right, left ^ (hash_ids(right.astype(np.int64), seed, salt=r + 1) & low)
        x = (left << np.uint64(half_bits)) | right
        values[pending] = x
        inside = x < np.uint64(num_nodes)
        out[pending[inside]] = x[inside]
        pending = pending[~inside]
    return out.astype(np.int64)


def random_assignment(num_nodes: int, num_parts: int, seed: int = 0, ids: np.ndarray | None = None) -> np.ndarray:
    """Uniformly random and balanced (sizes differ by at most one): part = permuted id mod ``num_parts``.

    ``ids``: the node ids to assign (default all); the assignment of an id depends only on
    ``(seed, num_nodes, num_parts, id)``, so any process can compute its share of it.
    """
    if ids is None:
        ids = np.arange(num_nodes, dtype=np.int64)
    return permute_ids(ids, num_nodes, seed) % num_parts


def range_assignment(type_counts: list[int], num_parts: int, ids: np.ndarray | None = None) -> np.ndarray:
    """Each node type's ids split into ``num_parts`` consecutive ranges of sizes differing by at most one.

    ``type_counts``: node count per type (homogeneous ids number the types one after the other);
    ``ids``: homogeneous ids to assign (default all).
    """
    offsets = np.zeros(len(type_counts) + 1, dtype=np.int64)
    np.cumsum(type_counts, out=offsets[1:])
    if ids is None:
        ids = np.arange(int(offsets[-1]), dtype=np.int64)
    ids = np.asarray(ids, dtype=np.int64)
    ntype = np.searchsorted(offsets[1:], ids, side="right")
    count = (offsets[1:] - offsets[:-1])[ntype]
    local = ids - offsets[ntype]
    # The first count % P ranges hold one more node, as chunk_sizes splits rows.
    big, rem = count // num_parts + 1, count % num_parts
    in_big = local < big * rem
    return np.where(in_big, local // np.maximum(big, 1), rem + (local - big * rem) // np.maximum(big - 1, 1))
