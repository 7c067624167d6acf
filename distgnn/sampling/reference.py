"""Plain numpy references for the sampling kernels in :mod:`distgnn.sampling.cpu`.

Same signatures and the same semantics as the C++ kernels, written for
clarity, not speed; tests compare the two. Random picks follow the same
distributions but not the same random streams, so results agree exactly only
where the answer is deterministic (all neighbours, fanout >= degree, counts).
"""

from __future__ import annotations

import numpy as np
import torch

from distgnn.sampling.block import Block


def sample_neighbors(
    indptr: np.ndarray,
    indices: np.ndarray,
    seeds: np.ndarray,
    fanout: int | np.ndarray,
    replace: bool = False,
    prob: np.ndarray | None = None,
    rng_seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Pick up to ``fanout`` in-neighbours of each seed from a CSC graph.

    Args:
        indptr: ``(num_nodes + 1,)`` int64 CSC row pointer.
        indices: ``(num_edges,)`` int32 or int64 source node of each edge position.
        seeds: ``(num_seeds,)`` int64 node ids, repeats allowed.
        fanout: neighbours per seed; ``-1`` takes all of them; or an array, one fanout per seed.
        replace: draw with replacement (``fanout`` picks whenever one is possible).
        prob: optional ``(num_edges,)`` float32 non-negative weight per edge
            position; zero-weight edges are never picked.
        rng_seed: seed of the random stream.

    Returns:
        ``counts`` ``(num_seeds,)`` int64 picks per seed and ``positions``
        ``(counts.sum(),)`` int64 positions into ``indices``, grouped by seed
        in seed order.
    """
    rng = np.random.default_rng(rng_seed)
    counts = np.zeros(len(seeds), dtype=np.int64)
    picked: list[np.ndarray] = []
    fanouts = np.broadcast_to(np.asarray(fanout, dtype=np.int64), (len(seeds),))
    for i, seed in enumerate(np.asarray(seeds, dtype=np.int64)):
        fanout = int(fanouts[i])
        start, end = int(indptr[seed]), int(indptr[seed + 1])
        candidates = np.arange(start, end, dtype=np.int64)
        weights = None
        if prob is not None:
            weights = np.asarray(prob[start:end], dtype=np.float64)
            candidates = candidates[weights > 0]
            weights = weights[weights > 0]
        if fanout == -1 or (not replace and len(candidates) <= fanout) or len(candidates) == 0:
            pick = candidates
        else:
            p = None if weights is None else weights / weights.sum()
            pick = rng.choice(candidates, size=fanout, replace=replace, p=p)
        counts[i] = len(pick)
        picked.append(pick.astype(np.int64))
    positions = np.concatenate(picked) if picked else np.zeros(0, dtype=np.int64)
    return counts, positions


def to_block(
    dst_nids: np.ndarray,
    counts: np.ndarray,
    src_nids_per_edge: np.ndarray,
    eids: np.ndarray,
) -> Block:
    """Relabel sampled edges into a :class:`Block`.

    Args:
        dst_nids: ``(num_dst,)`` int64 unique global ids of the destination nodes.
        counts: ``(num_dst,)`` int64 in-edges per destination node.
        src_nids_per_edge: ``(num_edges,)`` int64 global source id of each edge,
            grouped by destination in ``dst_nids`` order.
        eids: ``(num_edges,)`` int64 global edge ids.

    Returns:
        A block whose sources are ``dst_nids`` followed by the other sources in
        order of first appearance among the edges.
    """
    local: dict[int, int] = {}
    for nid in dst_nids.tolist():
        if nid in local:
            raise ValueError(f"dst_nids must be unique; {nid} appears twice")
        local[nid] = len(local)
    indices = np.empty(len(src_nids_per_edge), dtype=np.int64)
    for e, nid in enumerate(src_nids_per_edge.tolist()):
        indices[e] = local.setdefault(nid, len(local))
    src_nids = np.fromiter(local.keys(), dtype=np.int64, count=len(local))
    indptr = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return Block(
        src_nids=torch.from_numpy(src_nids),
        num_dst=len(dst_nids),
        indptr=torch.from_numpy(indptr),
        indices=torch.from_numpy(indices),
        eids=torch.from_numpy(np.asarray(eids, dtype=np.int64).copy()),
    )
