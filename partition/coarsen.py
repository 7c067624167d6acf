"""Multilevel front end for METIS: cluster, contract, partition the small graph, project back, refine.

pymetis' METIS 5.1 keeps every coarsening level in memory with 64-bit indices
(about 100 bytes per adjacency entry), which is most of a products-scale
partition run's peak. Here the first coarsening steps are done in vectorised
numpy instead, the way multilevel partitioners (KaMinPar, Mt-KaHyPar) do them:

* size-constrained label propagation clusters the graph (each node joins the
  neighbouring cluster it has the most edge weight to, unless that cluster would
  pass the size cap in any balance constraint); nodes are visited in random
  batches so neighbours rarely decide at the same time;
* contraction turns clusters into vertices (vertex weight = summed weights of
  every constraint column, edge weight = summed parallel edges; intra-cluster
  edges vanish);
* METIS partitions the contracted graph (multi-constraint vertex weights and
  edge weights, best of a few cuts) with its usual 3% imbalance;
* the assignment is projected level by level back to the input; each level is
  rebalanced if a part is above the 3% bound, then refined: one round of label
  propagation whose labels are the parts (a node moves to the part it has
  strictly more edges to), then a few iterations of Jet-style refinement
  (Gilbert et al. 2023: small negative gains allowed, an afterburner that
  re-scores each move as if the better-ranked moves had happened, best cut
  kept). No move takes a part above the bound.

Graphs are CSR ``(xadj int64, adjncy, adjwgt or None for unit weights)``, both
directions of every edge, no self loops. ``vwgt`` is ``(N, ncon)`` int64.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from distgnn.partition.metis import metis_kway

logger = logging.getLogger(__name__)

# Adjacency entries handled at once when contracting (bounds the scratch arrays).
_CHUNK = 1 << 23


@dataclass
class WeightedGraph:
    xadj: np.ndarray  # (N+1,) int64
    adjncy: np.ndarray  # int32 or int64 neighbour ids
    adjwgt: np.ndarray | None  # int64 edge weights, None = all ones
    vwgt: np.ndarray  # (N, ncon) int64

    @property
    def num_nodes(self) -> int:
        return self.xadj.shape[0] - 1

    @property
    def num_entries(self) -> int:
        return self.adjncy.shape[0]


def _ids(num: int) -> type:
    return np.int32 if num < np.iinfo(np.int32).max else np.int64


def _segment_positions(xadj: np.ndarray, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(owner, pos)``: adjacency positions of ``nodes`` and the index into ``nodes`` each belongs to."""
    counts = xadj[nodes + 1] - xadj[nodes]
    total = int(counts.sum())
    owner = np.repeat(np.arange(nodes.shape[0], dtype=np.int64), counts)
    pos = np.arange(total, dtype=np.int64)
    pos += np.repeat(xadj[nodes] - (np.cumsum(counts) - counts), counts)
    return owner, pos


def _aggregate(keys: np.ndarray, weights: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Distinct ``keys`` (sorted; non-negative int64, sorted in place) and the summed weight of each.

    ``weights=None`` counts. Weights ride in the low bits of the keys when both
    fit in 63 bits, because numpy's SIMD sort is ten times faster than argsort.
    """
    if keys.shape[0] == 0:
        return keys, np.zeros(0, dtype=np.int64)
    if weights is None:
        keys.sort()
    else:
        key_bits = int(keys.max()).bit_length()
        weight_bits = max(int(weights.max()).bit_length(), 1)
        if key_bits + weight_bits <= 63:
            keys <<= weight_bits
            keys |= weights
            keys.sort()
            weights = keys & ((1 << weight_bits) - 1)
            keys >>= weight_bits
        else:
            order = np.argsort(keys)
            keys, weights = keys[order], weights[order]
            del order
    first = np.empty(keys.shape[0], dtype=bool)
    first[0] = True
    np.not_equal(keys[1:], keys[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    del first
    if weights is None:
        sums = np.diff(np.append(starts, keys.shape[0])).astype(np.int64)
    else:
        sums = np.add.reduceat(weights, starts).astype(np.int64, copy=False)
    return keys[starts], sums


def _admit(target: np.ndarray, source: np.ndarray, w: np.ndarray, label_w: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """Mask of the moves (given in priority order) that keep every label ``<= cap`` once all admitted moves are done.

    A label admits incoming moves in order while its weight, less what the
    admitted moves take out of it, stays under the cap; a few passes settle the
    outflow, and if the result still overflows only the moves that fit without
    any outflow are kept.
    """
    order = np.argsort(target, kind="stable")
    t, wt = target[order], w[order]
    inside = np.cumsum(wt, axis=0)
    group_start = np.searchsorted(t, t, side="left")
    inside -= np.where(group_start[:, None] > 0, inside[np.maximum(group_start - 1, 0)], 0)
    room = cap - label_w
    ok_sorted = np.all(inside <= room[t], axis=1)
    if source is not None:
        for _ in range(3):
            ok = np.empty_like(ok_sorted)
            ok[order] = ok_sorted
            outflow = np.zeros_like(label_w)
            np.add.at(outflow, source[ok], w[ok])
            ok_sorted = np.all(inside <= (room + outflow)[t], axis=1)
        ok = np.empty_like(ok_sorted)
        ok[order] = ok_sorted
        after = label_w.copy()
        np.subtract.at(after, source[ok], w[ok])
        np.add.at(after, target[ok], w[ok])
        if np.all(after <= np.maximum(cap, label_w)):
            return ok
        ok_sorted = np.all(inside <= room[t], axis=1)
    ok = np.empty_like(ok_sorted)
    ok[order] = ok_sorted
    return ok


def _propagate_batch(
    g: WeightedGraph,
    batch: np.ndarray,
    label: np.ndarray,
    label_w: np.ndarray,
    cap: np.ndarray,
    num_labels: int,
    rng: np.random.Generator,
) -> int:
    """One synchronous label-propagation step over ``batch`` (sorted node ids); returns the moves made."""
    owner, pos = _segment_positions(g.xadj, batch)
    owner_count = owner.shape[0]
    nbr_label = label[g.adjncy[pos]].astype(np.int64)
    weights = None if g.adjwgt is None else g.adjwgt[pos]
    del pos
    b = batch.shape[0]
    cur = label[batch].astype(np.int64)
    node_w = g.vwgt[batch]
    if num_labels * b <= 4 * max(owner_count, 1 << 16):
        # Few labels (refinement): dense (batch, label) connection table.
        conn = np.bincount(owner * num_labels + nbr_label, weights=weights, minlength=b * num_labels)
        conn = conn.reshape(b, num_labels)
        del owner, nbr_label, weights
        rows = np.arange(b)
        stay = conn[rows, cur] + 0.5
        fits = np.all(label_w[None, :, :] + node_w[:, None, :] <= cap, axis=2)
        score = np.where(fits & (conn > 0), conn + rng.random(conn.shape) * 0.5, -1.0)
        score[rows, cur] = -1.0
        best = np.argmax(score, axis=1)
        best_score = score[rows, best]
    else:
        keys, conn = _aggregate(owner * num_labels + nbr_label, weights)
        del owner, nbr_label, weights
        own, cand = np.divmod(keys, num_labels)
        del keys
        is_cur = cand == cur[own]
        stay = np.bincount(own[is_cur], weights=conn[is_cur], minlength=b) + 0.5
        if cap.shape[0] == 1:
            fits = label_w[cand, 0] + node_w[own, 0] <= cap[0]
        else:
            fits = np.all(label_w[cand] + node_w[own] <= cap, axis=1)
        fits &= ~is_cur
        score = conn + rng.random(conn.shape[0]) * 0.5
        score[~fits] = -1.0
        del fits, is_cur
        # Entries are grouped by owner; every batch node has at least one entry.
        starts = np.flatnonzero(np.diff(own, prepend=-1))
        best_score = np.maximum.reduceat(score, starts)
        hit = np.flatnonzero(score == np.repeat(best_score, np.diff(np.append(starts, own.shape[0]))))
        first = hit[np.diff(own[hit], prepend=-1) != 0]
        best = cand[first]
    move = np.flatnonzero(best_score > stay)
    if move.shape[0] == 0:
        return 0
    target = best[move]
    # Several movers may pick one label: admit them while the label stays under the cap.
    w = node_w[move]
    ok = _admit(target, cur[move] if num_labels * b <= 4 * max(owner_count, 1 << 16) else None, w, label_w, cap)
    move, target, w = move[ok], target[ok], w[ok]
    np.subtract.at(label_w, cur[move], w)
    np.add.at(label_w, target, w)
    label[batch[move]] = target
    return int(move.shape[0])


def propagate(
    g: WeightedGraph,
    label: np.ndarray,
    label_w: np.ndarray,
    cap: np.ndarray,
    num_labels: int,
    rounds: int,
    batches: int,
    rng: np.random.Generator,
    min_moves: float = 0.0,
) -> int:
    """Size-constrained label propagation, updating ``label`` and ``label_w`` in place.

    ``label_w[l]`` is the summed ``vwgt`` of label ``l``; a node moves to the
    adjacent label with the most edge weight to it (ties broken at random) if
    that is strictly more than to its own and the label stays ``<= cap`` in
    every column. Stops early when a round moves at most ``min_moves * N`` nodes.
    Returns the number of moves.
    """
    active = np.flatnonzero(np.diff(g.xadj) > 0)
    total = 0
    for _ in range(rounds):
        moved = 0
        for batch in np.array_split(rng.permutation(active), batches):
            if batch.shape[0]:
                batch.sort()
                moved += _propagate_batch(g, batch, label, label_w, cap, num_labels, rng)
        total += moved
        logger.debug("propagate round: %d moves", moved)
        if moved <= min_moves * g.num_nodes:
            break
    return total


def cluster(g: WeightedGraph, cap: np.ndarray, rounds: int, rng: np.random.Generator) -> np.ndarray:
    """Cluster ids (not compacted) of size-constrained label propagation from singletons."""
    n = g.num_nodes
    label = np.arange(n, dtype=_ids(n))
    label_w = g.vwgt.copy()
    propagate(g, label, label_w, cap, n, rounds, batches=16, rng=rng, min_moves=0.01)
    # Isolated nodes (and any left alone) cost nothing to group: pack singletons into full clusters.
    size = np.bincount(label, minlength=n)
    lonely = np.flatnonzero((size[label] == 1) & (np.diff(g.xadj) == 0))
    if lonely.shape[0] > 1:
        per = max(1, int(np.min(cap // np.maximum(g.vwgt[lonely].max(axis=0), 1))))
        label[lonely] = lonely[(np.arange(lonely.shape[0]) // per) * per]
    return label


def contract(g: WeightedGraph, label: np.ndarray) -> tuple[np.ndarray, WeightedGraph]:
    """``(cmap (N,), coarse graph)``: clusters of ``label`` become vertices."""
    n = g.num_nodes
    used = np.zeros(n, dtype=bool)
    used[label] = True
    new_id = np.cumsum(used, dtype=np.int64) - 1
    c = int(new_id[-1]) + 1 if n else 0
    del used
    cmap = new_id[label].astype(_ids(c))
    del new_id
    vwgt = np.stack(
        [np.bincount(cmap, weights=g.vwgt[:, j], minlength=c) for j in range(g.vwgt.shape[1])], axis=1
    ).astype(np.int64)
    keys_parts, wgt_parts = [], []
    deg = np.diff(g.xadj)
    lo = 0
    while lo < n:
        hi = int(np.searchsorted(g.xadj, g.xadj[lo] + _CHUNK, side="right")) - 1
        hi = min(max(hi, lo + 1), n)
        s, e = int(g.xadj[lo]), int(g.xadj[hi])
        cu = np.repeat(cmap[lo:hi].astype(np.int64), deg[lo:hi])
        cv = cmap[g.adjncy[s:e]]
        keep = cu != cv
        keys = cu[keep] * c + cv[keep]
        del cu, cv
        weights = None if g.adjwgt is None else g.adjwgt[s:e][keep]
        keys, sums = _aggregate(keys, weights)
        keys_parts.append(keys)
        wgt_parts.append(sums)
        lo = hi
    keys = np.concatenate(keys_parts)
    del keys_parts
    weights = np.concatenate(wgt_parts)
    del wgt_parts
    keys, adjwgt = _aggregate(keys, weights)
    del weights
    if adjwgt.shape[0] and adjwgt.max() < np.iinfo(np.int32).max:
        adjwgt = adjwgt.astype(np.int32)
    xadj = np.searchsorted(keys, np.arange(c + 1, dtype=np.int64) * c).astype(np.int64)
    adjncy = (keys % c).astype(_ids(c))
    return cmap, WeightedGraph(xadj, adjncy, adjwgt, vwgt)


def _edge_cut(g: WeightedGraph, part: np.ndarray) -> int:
    """Summed weight of cut undirected edges."""
    cut = 0
    n = g.num_nodes
    lo = 0
    while lo < n:
        hi = min(max(int(np.searchsorted(g.xadj, g.xadj[lo] + _CHUNK, side="right")) - 1, lo + 1), n)
        s, e = int(g.xadj[lo]), int(g.xadj[hi])
        differs = np.repeat(part[lo:hi], np.diff(g.xadj[lo : hi + 1])) != part[g.adjncy[s:e]]
        cut += int(differs.sum() if g.adjwgt is None else g.adjwgt[s:e][differs].sum())
        lo = hi
    return cut // 2


def _connectivity(g: WeightedGraph, part: np.ndarray, k: int) -> np.ndarray:
    """``(N, k)`` int64: edge weight from each node to each part."""
    n = g.num_nodes
    conn = np.empty((n, k), dtype=np.int64)
    lo = 0
    while lo < n:
        hi = min(max(int(np.searchsorted(g.xadj, g.xadj[lo] + _CHUNK, side="right")) - 1, lo + 1), n)
        s, e = int(g.xadj[lo]), int(g.xadj[hi])
        idx = np.repeat(np.arange(hi - lo, dtype=np.int64) * k, np.diff(g.xadj[lo : hi + 1]))
        idx += part[g.adjncy[s:e]]
        counts = np.bincount(idx, weights=None if g.adjwgt is None else g.adjwgt[s:e], minlength=(hi - lo) * k)
        conn[lo:hi] = counts.reshape(hi - lo, k)
        lo = hi
    return conn


def jet_refine(
    g: WeightedGraph,
    part: np.ndarray,
    part_w: np.ndarray,
    bound: np.ndarray,
    k: int,
    iterations: int,
    rng: np.random.Generator,
    tolerance: float = 0.25,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Jet-style refinement (Gilbert et al. 2023), all nodes at once; returns the best ``(part, part_w, moves)``.

    Candidates are nodes whose best other part costs at most ``tolerance`` of their
    own-part edge weight (negative gains allowed, to leave local minima); the
    afterburner recomputes each candidate's gain as if the candidates ranked above
    it had moved already and keeps the non-negative ones; moves enter a part in
    rank order while it stays under ``bound``; nodes moved in one iteration are
    locked in the next. The best cut seen is kept.
    """
    n = g.num_nodes
    rows = np.arange(n)
    locked = np.zeros(n, dtype=bool)
    best = (part.copy(), part_w.copy(), None)
    moves = 0
    for _ in range(iterations + 1):
        conn = _connectivity(g, part, k)
        own = conn[rows, part]
        cut = int(conn.sum() - own.sum()) // 2
        if best[2] is None or cut < best[2]:
            best = (part.copy(), part_w.copy(), cut)
        elif cut > best[2] * 1.02:
            break
        if _ == iterations:
            break
        conn[rows, part] = -1
        dest = conn.argmax(axis=1)
        to_dest = conn[rows, dest]
        del conn
        gain = to_dest - own
        cand = (to_dest > 0) & (gain >= -np.floor(tolerance * own)) & ~locked
        nodes = np.flatnonzero(cand)
        if nodes.shape[0] == 0:
            break
        rank = np.zeros(n, dtype=np.int64)
        rank[nodes] = gain[nodes] * n + rng.permutation(nodes.shape[0])
        # Afterburner over the candidates' adjacency.
        owner, pos = _segment_positions(g.xadj, nodes)
        u = g.adjncy[pos]
        first = cand[u] & (rank[u] > rank[nodes][owner])
        pu = np.where(first, dest[u], part[u])
        del first, u
        w = None if g.adjwgt is None else g.adjwgt[pos]
        del pos
        to_dest_after = pu == dest[nodes][owner]
        to_own_after = pu == part[nodes][owner]
        del pu
        if w is None:
            new_gain = np.bincount(owner[to_dest_after], minlength=nodes.shape[0]).astype(np.int64)
            new_gain -= np.bincount(owner[to_own_after], minlength=nodes.shape[0])
        else:
            new_gain = np.bincount(owner, weights=w * to_dest_after, minlength=nodes.shape[0])
            new_gain -= np.bincount(owner, weights=w * to_own_after, minlength=nodes.shape[0])
        del owner, w, to_dest_after, to_own_after
        move = nodes[new_gain >= 0]
        # Admit moves into each part in rank order while it stays under the bound.
        move = move[np.argsort(-rank[move], kind="stable")]
        target = dest[move]
        mw = g.vwgt[move]
        ok = _admit(target, part[move].astype(np.int64), mw, part_w, bound)
        move, target, mw = move[ok], target[ok], mw[ok]
        np.subtract.at(part_w, part[move], mw)
        np.add.at(part_w, target, mw)
        part[move] = target
        locked[:] = False
        locked[move] = True
        moves += int(move.shape[0])
    part[:] = best[0]
    part_w[:] = best[1]
    return part, part_w, moves


def rebalance(
    g: WeightedGraph, part: np.ndarray, part_w: np.ndarray, bound: np.ndarray, k: int, rounds: int = 8
) -> int:
    """Move nodes out of parts above ``bound`` (cheapest cut increase first) into parts with room.

    Updates ``part``/``part_w`` in place; returns the moves made. Used when METIS's
    result on the coarse graph (lumpy vertex weights) ends above the 3% bound.
    """
    moves = 0
    rows = np.arange(g.num_nodes)
    for _ in range(rounds):
        excess = part_w - bound
        over = np.any(excess > 0, axis=1)
        if not over.any():
            break
        conn = _connectivity(g, part, k).astype(np.float64)
        own = conn[rows, part]
        # Only into parts the node fits in (which excludes every part above the bound).
        conn[~np.all(part_w[None, :, :] + g.vwgt[:, None, :] <= bound, axis=2)] = -np.inf
        conn[rows, part] = -np.inf
        dest = conn.argmax(axis=1)
        loss = own - conn[rows, dest]
        heavy = np.any((g.vwgt > 0) & (excess[part] > 0), axis=1)
        nodes = np.flatnonzero(over[part] & heavy & np.isfinite(loss))
        if nodes.shape[0] == 0:
            break
        nodes = nodes[np.lexsort((loss[nodes], part[nodes]))]
        src = part[nodes].astype(np.int64)
        w = g.vwgt[nodes]
        taken = np.cumsum(w, axis=0)
        group_start = np.searchsorted(src, src, side="left")
        taken -= np.where(group_start[:, None] > 0, taken[np.maximum(group_start - 1, 0)], 0)
        # Keep a node while its part still has excess left in some column before it moves.
        need = np.any((taken - w < excess[src]) & (excess[src] > 0), axis=1)
        nodes, src, w = nodes[need], src[need], w[need]
        target = dest[nodes]
        ok = _admit(target, None, w, part_w, np.maximum(bound, part_w))
        nodes, src, target, w = nodes[ok], src[ok], target[ok], w[ok]
        if nodes.shape[0] == 0:
            break
        np.subtract.at(part_w, src, w)
        np.add.at(part_w, target, w)
        part[nodes] = target
        moves += int(nodes.shape[0])
    return moves


def _metis(g: WeightedGraph, num_parts: int, seed: int, ncuts: int) -> np.ndarray:
    part, _ = metis_kway(
        g.xadj,
        g.adjncy.astype(np.int64),
        np.ascontiguousarray(g.vwgt),
        g.adjwgt.astype(np.int64) if g.adjwgt is not None else None,
        num_parts,
        seed,
        ncuts,
    )
    return part


def coarsened_metis(
    xadj: np.ndarray,
    adjncy: np.ndarray,
    vwgt: np.ndarray | None,
    num_parts: int,
    seed: int = 0,
    *,
    coarse_nodes: int | None = None,
    max_levels: int = 4,
    cluster_rounds: int = 2,
    refine_rounds: int = 1,
    imbalance: float = 1.03,
    metis_ncuts: int = 4,
    cluster_frac: float | None = None,
    jet_iterations: int = 4,
) -> tuple[np.ndarray, int]:
    """Partition the graph ``(xadj, adjncy)`` (symmetric, unit edge weights) into ``num_parts``.

    Clusters (cluster weight at most ``cluster_frac`` of the total in every
    ``vwgt`` column; default ``(imbalance - 1) / num_parts``) and contracts, at
    most ``max_levels`` times and until at most ``coarse_nodes`` vertices remain
    (default ``max(4096, 256 * num_parts)``), hands that graph to METIS, then
    projects back with rebalancing and refinement. ``adjncy`` may be int32;
    ``vwgt`` is ``(N, ncon)`` or None (node counts). Returns ``(part (N,) int64,
    edge cut of the input graph)``.
    """
    n = xadj.shape[0] - 1
    if vwgt is None:
        vwgt = np.ones((n, 1), dtype=np.int64)
    rng = np.random.default_rng(seed)
    total = vwgt.sum(axis=0)
    if coarse_nodes is None:
        coarse_nodes = max(4096, 256 * num_parts)
    # A cluster is at most the 3% slack of one part, so METIS can still balance the coarse graph.
    frac = cluster_frac if cluster_frac is not None else (imbalance - 1) / num_parts
    cap = np.maximum(np.ceil(total * frac).astype(np.int64), 1)
    levels, g = _coarsen(WeightedGraph(xadj, adjncy, None, vwgt), cap, coarse_nodes, max_levels, cluster_rounds, rng)
    start = time.perf_counter()
    part = _metis(g, num_parts, seed, metis_ncuts).astype(np.int8 if num_parts < 128 else np.int64)
    part_w = np.stack([np.bincount(part, weights=g.vwgt[:, j], minlength=num_parts) for j in range(total.shape[0])], 1)
    part_w = part_w.astype(np.int64)
    target = np.ceil(imbalance * total / num_parts).astype(np.int64)
    # Refinement keeps every part under METIS's 3% bound, or under what METIS reached if that is more;
    # each level first moves nodes out of parts above the 3% bound where it can.
    bound = np.maximum(target, part_w.max(axis=0))
    logger.info(
        "METIS on %d nodes, %d adjacency entries: %.1f s", g.num_nodes, g.num_entries, time.perf_counter() - start
    )
    del g
    while levels:
        fine, cmap = levels.pop()
        part = part[cmap]
        del cmap
        start = time.perf_counter()
        if np.any(part_w > target):
            rebalance(fine, part, part_w, target, num_parts)
            bound = np.maximum(target, part_w.max(axis=0))
        moves = propagate(fine, part, part_w, bound, num_parts, refine_rounds, batches=8, rng=rng, min_moves=1e-4)
        if jet_iterations:
            moves += jet_refine(fine, part, part_w, bound, num_parts, jet_iterations, rng)[2]
        logger.info("refine %d nodes: %d moves (%.1f s)", fine.num_nodes, moves, time.perf_counter() - start)
    part = part.astype(np.int64)
    return part, _edge_cut(WeightedGraph(xadj, adjncy, None, vwgt), part)


def _coarsen(
    g: WeightedGraph, cap: np.ndarray, coarse_nodes: int, max_levels: int, cluster_rounds: int, rng: np.random.Generator
) -> tuple[list[tuple[WeightedGraph, np.ndarray]], WeightedGraph]:
    """Clusters (weight at most ``cap``) and contracts ``g`` up to ``max_levels`` times, until at most
    ``coarse_nodes`` vertices remain or a level shrinks it by less than a tenth. Returns every level's ``(graph,
    map to the next)`` and the coarsest graph."""
    levels: list[tuple[WeightedGraph, np.ndarray]] = []
    while g.num_nodes > coarse_nodes and len(levels) < max_levels:
        start = time.perf_counter()
        label = cluster(g, cap, cluster_rounds, rng)
        mid = time.perf_counter()
        cmap, coarse = contract(g, label)
        del label
        logger.info(
            "coarsen level %d: %d -> %d nodes, %d -> %d adjacency entries (cluster %.1f s, contract %.1f s)",
            len(levels),
            g.num_nodes,
            coarse.num_nodes,
            g.num_entries,
            coarse.num_entries,
            mid - start,
            time.perf_counter() - mid,
        )
        if coarse.num_nodes > 0.9 * g.num_nodes:
            break
        levels.append((g, cmap))
        g = coarse
    return levels, g


def balance(part: np.ndarray, vwgt: np.ndarray | None, num_parts: int) -> float:
    """Largest part weight over the average, worst constraint column."""
    if vwgt is None:
        vwgt = np.ones((part.shape[0], 1), dtype=np.int64)
    worst = 0.0
    for j in range(vwgt.shape[1]):
        w = np.bincount(part, weights=vwgt[:, j], minlength=num_parts)
        worst = max(worst, float(w.max() * num_parts / max(w.sum(), 1)))
    return worst
