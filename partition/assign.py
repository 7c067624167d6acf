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

METHODS = ("metis", "random")


def unique_sorted(values: np.ndarray) -> np.ndarray:
    """Sorted distinct values of an int array, sorting ``values`` in place.

    ``np.unique`` hashes first on recent numpy, which is far slower than the SIMD
    sort at tens of millions of ids.
    """
    values.sort()
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


def random_assignment(num_nodes: int, num_parts: int, seed: int = 0) -> np.ndarray:
    """Uniformly random and balanced (sizes differ by at most one)."""
    part = np.empty(num_nodes, dtype=np.int64)
    part[np.random.default_rng(seed).permutation(num_nodes)] = np.arange(num_nodes, dtype=np.int64) % num_parts
    return part
