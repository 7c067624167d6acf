"""METIS-based multilevel partitioning across the ranks of a distributed partition job.

The graph METIS sees is the symmetrised simple graph (no self loops, no duplicates), as in the
single-process tool. Each level's vertices are split evenly over the ranks (rank ``r`` owns ids
``[r n / W, (r + 1) n / W)``) with their adjacency (neighbour, edge weight) and vertex weight.

* **Coarsening**: size-constrained label propagation. Labels start as the vertex ids; in a round half of
  the vertices (chosen by a hash of (seed, level, round, id)) look up their neighbours' labels and those
  clusters' weights at the labels' owners and propose to join the cluster they are most connected to;
  the owner of a cluster accepts proposals in hash order while the cluster stays within
  ``max_cluster``. Clusters are numbered in id order and contracted (vertex and edge weights summed)
  until the coarse graph has at most ``coarse_edges`` adjacency entries or stops shrinking.
* **Initial partition**: the coarsest graph is gathered on rank 0 and partitioned by METIS
  (``partition.metis.metis_kway``, with vertex and edge weights); parts go back to the owners.
* **Uncoarsening**: parts are projected level by level; on each level label propagation over parts
  refines them: a vertex proposes the part it is most connected to when that gains, or, in an
  overweight part, any part with room; the part's rank accepts in (gain, hash) order within
  ``(1 + imbalance) * total / P``; a level's refinement ends once two rounds in a row moved next to no
  vertex.

Every decision depends on (seed, vertex ids, the graph) only, and every tie is broken by the ids, so the
partition is the same whatever the number of ranks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from distgnn.partition.assign import hash_ids, unique_sorted
from distgnn.partition.metis import metis_kway

logger = logging.getLogger(__name__)

COARSE_EDGES = 50_000_000
COARSEN_ROUNDS = 4
REFINE_ROUNDS = 10
# Refinement of a level stops once two rounds in a row moved at most this fraction of its vertices.
STALL_FRACTION = 1e-3
IMBALANCE = 0.03
# A cluster holds at most this fraction of a part's weight.
CLUSTER_FRACTION = 1 / 16
# Contraction stops when a level keeps more than this fraction of its vertices.
MIN_SHRINK = 0.85
_HASH_BITS = 53
# Adjacency entries one step of a pass over a level handles: bounds its scratch arrays.
BLOCK_ENTRIES = 1 << 20


@dataclass
class Level:
    """One level's graph, as this rank holds it: the adjacency of its owned vertices in CSR form, each
    entry's neighbour stored as an index into the sorted distinct neighbours.

    Attributes:
        n: vertex count of the level; bounds: ``(W+1,)`` owner ranges of its ids.
        vw: ``(owned,)`` int64 vertex weights.
        indptr: ``(owned + 1,)`` int64; the entries of owned vertex ``i`` (local index) are
            ``indptr[i]:indptr[i + 1]``, sorted by neighbour.
        nbr: sorted distinct neighbours (level ids) of the owned vertices.
        index: ``(entries,)`` int32 (int64 past 2**31 neighbours): each entry's neighbour in ``nbr``.
        aw: ``(entries,)`` int64 edge weights, or None where every weight is 1 (level 0).
    """

    n: int
    bounds: np.ndarray
    vw: np.ndarray
    indptr: np.ndarray
    nbr: np.ndarray
    index: np.ndarray
    aw: np.ndarray | None

    @property
    def entries(self) -> int:
        return int(self.index.shape[0])

    def lo(self, rank: int) -> int:
        return int(self.bounds[rank])

    def owner(self, ids: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.bounds[1:], ids, side="right")

    def blocks(self, size: int = BLOCK_ENTRIES) -> list[tuple[int, int]]:
        """Ranges ``(first, last)`` of owned vertices covering them in order, each with fewer than
        ``2 * size`` entries plus one vertex's (a vertex is never split)."""
        owned = self.vw.shape[0]
        cuts = np.searchsorted(self.indptr, np.arange(size, self.entries, size, dtype=np.int64), side="right") - 1
        edges = unique_sorted(np.concatenate([[0], cuts, [owned]]).astype(np.int64))
        return list(zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True))

    def block(self, first: int, last: int, ones: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """``(owned vertex (local index), neighbour index into nbr, weight)`` of the entries of ``first:last``;
        the weights are None where every weight is 1 unless ``ones``."""
        e0, e1 = int(self.indptr[first]), int(self.indptr[last])
        au = np.repeat(np.arange(first, last, dtype=np.int64), np.diff(self.indptr[first : last + 1]))
        if self.aw is not None:
            return au, self.index[e0:e1], self.aw[e0:e1]
        return au, self.index[e0:e1], np.ones(e1 - e0, dtype=np.int64) if ones else None


def _level_from_keys(n: int, bounds: np.ndarray, rank: int, vw: np.ndarray, keys: np.ndarray, aw) -> Level:
    """The level from sorted distinct ``keys`` = local vertex * n + neighbour (consumed) and their weights."""
    owned = int(bounds[rank + 1] - bounds[rank])
    degree = np.zeros(owned, dtype=np.int64)
    for start in range(0, keys.shape[0], BLOCK_ENTRIES):
        degree += np.bincount(keys[start : start + BLOCK_ENTRIES] // n, minlength=owned)
    indptr = np.zeros(owned + 1, dtype=np.int64)
    np.cumsum(degree, out=indptr[1:])
    del degree
    np.remainder(keys, n, out=keys)  # now the neighbours
    nbr = unique_sorted(keys.copy())
    index = np.empty(keys.shape[0], dtype=np.int32 if nbr.shape[0] < (1 << 31) else np.int64)
    find = _finder(nbr, n, keys.nbytes // 2)
    for start in range(0, keys.shape[0], BLOCK_ENTRIES):
        index[start : start + BLOCK_ENTRIES] = find(keys[start : start + BLOCK_ENTRIES])
    return Level(n, bounds, vw, indptr, nbr, index, aw)


def _finder(distinct: np.ndarray, bound: int, budget_bytes: int):
    """A function giving the position in the sorted ``distinct`` ids (< ``bound``) of ids among them: a
    gather from a table of ``bound`` positions where that table takes at most ``budget_bytes``, else a
    binary search (one random read per id instead of about log2 of the count)."""
    dtype = np.int32 if distinct.shape[0] < (1 << 31) else np.int64
    if np.dtype(dtype).itemsize * bound > budget_bytes:
        return lambda ids: np.searchsorted(distinct, ids)
    table = np.empty(bound, dtype=dtype)
    table[distinct] = np.arange(distinct.shape[0], dtype=dtype)
    return lambda ids: table[ids]


def _bounds(n: int, world: int) -> np.ndarray:
    return np.array([r * n // world for r in range(world + 1)], dtype=np.int64)


def _unit(values: np.ndarray, seed: int, salt: int) -> np.ndarray:
    """A hash of each value in [0, 1), from (seed, salt, value) alone."""
    return (hash_ids(values, seed, salt) >> np.uint64(64 - _HASH_BITS)).astype(np.float64) / float(1 << _HASH_BITS)


def _sum_by_key(keys: np.ndarray, values: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Distinct sorted ``keys`` and the sum of ``values`` per key (``None``: every value 1)."""
    keys, sums, _ = _group_sum(keys, values)
    return keys, sums


def _group_sum(keys: np.ndarray, values: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct sorted ``keys``, the sum of ``values`` per key (``None``: every value 1) and one position of
    each key in ``keys``. The keys come in runs already sorted (a block's vertices in order), which numpy's
    stable sort merges instead of sorting from scratch."""
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    if not keys.size:
        return keys, np.zeros(0, dtype=np.int64), order
    starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
    if values is None:
        sums = np.diff(np.append(starts, keys.shape[0])).astype(np.int64)
    else:
        sums = np.add.reduceat(values[order], starts)
    return keys[starts], sums, order[starts]


def _of_active(au: np.ndarray, index: np.ndarray, aw: np.ndarray | None, active: np.ndarray | None):
    """A block's entries ``(vertex, neighbour index, weight)`` of the ``active`` vertices only (None: all)."""
    if active is None:
        return au, index, aw
    keep = active[au]
    return au[keep], index[keep], None if aw is None else aw[keep]


def _first_best(gu: np.ndarray, conn: np.ndarray, tie: np.ndarray) -> np.ndarray:
    """Positions of each run of equal ``gu`` (sorted) holding its largest ``conn``, the smallest ``tie`` among
    those, the first such position where both are equal: the first row per ``gu`` in (``gu``, -``conn``,
    ``tie``, position) order, without a sort."""
    if not gu.size:
        return np.zeros(0, dtype=np.int64)
    starts = np.flatnonzero(np.concatenate([[True], gu[1:] != gu[:-1]]))
    run = np.repeat(np.arange(starts.shape[0]), np.diff(np.append(starts, gu.shape[0])))
    top = conn == np.maximum.reduceat(conn, starts)[run]
    tie = np.where(top, tie, np.inf)
    pick = np.flatnonzero(top & (tie == np.minimum.reduceat(tie, starts)[run]))
    first = np.concatenate([[True], run[pick[1:]] != run[pick[:-1]]])
    return pick[first]


def _pair_key(a: np.ndarray, b: np.ndarray, b_bound: int) -> np.ndarray:
    return a * np.int64(b_bound) + b


def _join(pieces: list[np.ndarray], dtype) -> np.ndarray:
    """The concatenation of ``pieces``, each freed once copied (the list is emptied)."""
    out = np.empty(sum(p.shape[0] for p in pieces), dtype=dtype)
    at = 0
    while pieces:
        piece = pieces.pop(0)
        out[at : at + piece.shape[0]] = piece
        at += piece.shape[0]
    return out


class Multilevel:
    """The multilevel partition of a job's graph (see the module docstring)."""

    def __init__(self, job, coarse_edges: int = COARSE_EDGES):
        self.job, self.group = job, job.group
        self.rank, self.world = job.rank, job.world
        self.P, self.seed = job.P, job.opts.seed
        self.msg = job.opts.message_bytes
        self.coarse_edges = coarse_edges

    # -- collectives over a level --------------------------------------------------------------

    def agreed(self, count: int) -> int:
        """The largest ``count`` over the ranks: the number of steps of a blocked collective."""
        return int(self.group.allreduce(np.array([count], dtype=np.int64), "max")[0])

    def lookup(self, level: Level, ids: np.ndarray, values: np.ndarray) -> np.ndarray:
        """``values`` (aligned with the owned vertices) of any level ids, from their owners,
        ``BLOCK_ENTRIES`` ids at a time."""
        lo = level.lo(self.rank)
        out = np.empty(ids.shape[0], dtype=np.int64)
        for k in range(self.agreed(-(-ids.shape[0] // BLOCK_ENTRIES))):
            piece = ids[k * BLOCK_ENTRIES : (k + 1) * BLOCK_ENTRIES]
            out[k * BLOCK_ENTRIES : k * BLOCK_ENTRIES + piece.shape[0]] = self.group.lookup(
                piece, level.owner(piece), lambda asked: values[asked - lo], self.msg
            )
        return out

    def neighbour_values(self, level: Level, values: np.ndarray) -> np.ndarray:
        """``values`` of each distinct neighbour (aligned with ``level.nbr``): index with ``level.index``."""
        return self.lookup(level, level.nbr, values)

    def _edge_blocks(self):
        """This rank's edges, chunk by chunk, in pieces of at most ``BLOCK_ENTRIES // 2``: ``(src, dst)``
        homogeneous ids; and the number of pieces."""
        job, layout = self.job, self.job.layout
        step = max(1, BLOCK_ENTRIES // 2)
        pieces = job.edge_pieces()
        count = sum(-(-layout.edge_chunks[job.etypes[t]][j] // step) for t, j in pieces)

        def generate():
            for t, j in pieces:
                etype = job.etypes[t]
                s, d = layout.read_edge_chunk(etype, j)
                s += job.node_offsets[job.ntypes.index(etype[0])]
                d += job.node_offsets[job.ntypes.index(etype[2])]
                for start in range(0, s.shape[0], step):
                    yield s[start : start + step], d[start : start + step]

        return generate(), count

    def level0(self) -> Level:
        """The symmetrised simple graph of the job's edges over the owned nodes, built from this rank's
        edge chunks piece by piece (each piece's entries go to their owners, which keep them distinct)."""
        job = self.job
        N, bounds = job.N, job.owner_bounds
        pieces, count = self._edge_blocks()
        got: list[np.ndarray] = []
        for _ in range(self.agreed(count)):
            s, d = next(pieces, (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)))
            keep = s != d
            u = np.concatenate([s[keep], d[keep]])
            v = np.concatenate([d[keep], s[keep]])
            del s, d, keep
            keys = unique_sorted(_pair_key(u, v, N))
            del u, v
            received = self.group.send_to(np.searchsorted(bounds[1:], keys // N, side="right"), keys, self.msg)
            del keys
            got.append(unique_sorted(received, runs=True))  # a sorted run from each rank
        keys = unique_sorted(_join(got, np.int64), runs=True)
        lo = int(bounds[self.rank])
        keys -= lo * N
        owned = int(bounds[self.rank + 1]) - lo
        return _level_from_keys(N, bounds, self.rank, np.ones(owned, dtype=np.int64), keys, None)

    # -- coarsening -------------------------------------------------------------------------------

    def _best(self, level: Level, targets: np.ndarray, current: np.ndarray, salt: int, allowed=None, active=None):
        """Per owned vertex with a neighbour: ``(vertex, best target, its connection, connection to current)``.

        ``targets``: per distinct neighbour (``level.nbr``) its label (or part); ``allowed(vertices,
        targets, neighbours)``: which (vertex, target) pairs may be chosen besides the current one, given
        one neighbour (index into ``level.nbr``) of the vertex with that target (no collective). The best
        target has the largest connection, ties broken by a hash of (seed, salt, target). ``active``: the
        owned vertices that may move (None: all); the others' entries are skipped, and their connection to
        their current target is left 0. Runs over blocks of owned vertices, so its scratch arrays are bounded
        by ``BLOCK_ENTRIES``.
        """
        bound = max(level.n, self.P)
        cur_conn = np.zeros(current.shape[0], dtype=np.int64)
        out_u, out_t, out_c = [], [], []
        for first, last in level.blocks():
            au, index, aw = _of_active(*level.block(first, last, ones=False), active)
            keys, conn, at = _group_sum(_pair_key(au, targets[index], bound), aw)
            nbr_of_key = index[at]
            del au, index, aw, at
            gu, gt = keys // bound, keys % bound
            del keys
            is_current = gt == current[gu]
            cur_conn[gu[is_current]] = conn[is_current]
            ok = ~is_current
            if allowed is not None:
                ok &= allowed(gu, gt, nbr_of_key)
            gu, gt, conn = gu[ok], gt[ok], conn[ok]
            pick = _first_best(gu, conn, _unit(gt, self.seed, salt))
            out_u.append(gu[pick])
            out_t.append(gt[pick])
            out_c.append(conn[pick])
        return _join(out_u, np.int64), _join(out_t, np.int64), _join(out_c, np.int64), cur_conn

    def _best_part(self, level: Level, targets: np.ndarray, current: np.ndarray, salt: int, allowed, active):
        """:meth:`_best` where targets are parts: each block's connections to the ``P`` parts counted into a
        dense (vertices, parts) table instead of sorted; the same result. ``allowed(vertices)``: the
        ``(vertices, P)`` table of allowed moves, never true for a vertex not ``active``."""
        P = self.P
        # Parts in (tie hash, part) order: the first best in that order breaks ties as in _best.
        by_tie = np.argsort(_unit(np.arange(P, dtype=np.int64), self.seed, salt), kind="stable")
        cur_conn = np.zeros(current.shape[0], dtype=np.int64)
        out_u, out_t, out_c = [], [], []
        step = max(1, (2 * BLOCK_ENTRIES) // P)
        for first, last in level.blocks():
            for a in range(first, last, step):
                b = min(last, a + step)
                au, index, aw = _of_active(*level.block(a, b, ones=False), active)
                table = np.bincount((au - a) * P + targets[index], weights=aw, minlength=(b - a) * P)
                del au, index, aw
                table = table.astype(np.int64).reshape(b - a, P)
                rows = np.arange(b - a)
                cur_conn[a:b] = table[rows, current[a:b]]
                ok = (table > 0) & allowed(np.arange(a, b, dtype=np.int64))
                ok[rows, current[a:b]] = False
                scored = np.where(ok, table, -1)[:, by_tie]
                del ok, table
                col = np.argmax(scored, axis=1)
                conn = scored[rows, col]
                has = conn > 0
                out_u.append(rows[has] + a)
                out_t.append(by_tie[col[has]])
                out_c.append(conn[has])
        return _join(out_u, np.int64), _join(out_t, np.int64), _join(out_c, np.int64), cur_conn

    def _accept(
        self,
        owner: np.ndarray,
        target: np.ndarray,
        weight: np.ndarray,
        priority: np.ndarray,
        vertex: np.ndarray,
        room_of,
    ) -> np.ndarray:
        """Proposals of ``vertex`` (level ids) to join ``target`` go to the target's ``owner``, which
        accepts them in ``priority`` order (float64, lower first; the vertex id breaks ties) while their
        summed ``weight`` fits ``room_of(targets)``; returns the accept flag per proposal, in order."""
        n = target.shape[0]
        rows = np.stack([target, weight, priority.astype(np.float64).view(np.int64), vertex], axis=1)
        order = np.argsort(owner, kind="stable")
        counts = np.bincount(owner, minlength=self.world).astype(np.int64)
        got, got_counts = self.group.alltoallv(rows[order], counts, self.msg)
        tg, w, prio = got[:, 0], got[:, 1], got[:, 2].view(np.float64)
        by = np.lexsort((got[:, 3], prio, tg))
        tg_s, w_s = tg[by], w[by]
        starts = np.flatnonzero(np.concatenate([[True], tg_s[1:] != tg_s[:-1]])) if tg_s.size else np.zeros(0, int)
        cum = np.cumsum(w_s)
        group_base = np.repeat(cum[starts] - w_s[starts], np.diff(np.append(starts, tg_s.size)))
        within = cum - group_base
        accepted_sorted = within <= room_of(tg_s)
        accepted = np.empty(got.shape[0], dtype=np.int64)
        accepted[by] = accepted_sorted
        replies, _ = self.group.alltoallv(accepted, got_counts, self.msg)
        out = np.empty(n, dtype=bool)
        out[order] = replies.astype(bool)
        return out

    def coarsen(self, level: Level, depth: int, max_cluster: int) -> tuple[Level, np.ndarray]:
        """Cluster ``level`` and contract it; returns ``(coarse level, coarse id of each owned vertex)``."""
        lo = level.lo(self.rank)
        owned = level.vw.shape[0]
        ids = np.arange(lo, lo + owned, dtype=np.int64)
        label = ids.copy()
        cweight = level.vw.copy()  # weight of the cluster labelled by each owned id
        for rnd in range(COARSEN_ROUNDS):
            salt = 1000 * depth + rnd
            nbr_label = self.neighbour_values(level, label)
            active = _unit(ids, self.seed, salt) < 0.5
            labels = unique_sorted(nbr_label.copy())
            # the weight of each neighbour's cluster
            nbr_weight = self.lookup(level, labels, cweight)[_finder(labels, level.n, level.index.nbytes)(nbr_label)]
            del labels

            def allowed(gu, gt, nbr, level=level, nbr_weight=nbr_weight, active=active):
                return (nbr_weight[nbr] + level.vw[gu] <= max_cluster) & active[gu]

            gu, gt, conn, cur = self._best(level, nbr_label, label, salt, allowed, active)
            move = conn > cur[gu]
            gu, gt = gu[move], gt[move]
            prio = _unit(gu + lo, self.seed, salt + 7)
            ok = self._accept(level.owner(gt), gt, level.vw[gu], prio, gu + lo, lambda t: max_cluster - cweight[t - lo])
            gu, gt = gu[ok], gt[ok]
            # The accepted joins were counted by the clusters' owners; now the departures and arrivals.
            old = label[gu]
            delta_ids = np.concatenate([old, gt])
            delta_w = np.concatenate([-level.vw[gu], level.vw[gu]])
            got = self.group.send_to(level.owner(delta_ids), np.stack([delta_ids, delta_w], axis=1), self.msg)
            np.add.at(cweight, got[:, 0] - lo, got[:, 1])
            label[gu] = gt
        # Number the clusters (labels still in use) in id order.
        used = cweight > 0
        counts = self.group.allgather(np.array([used.sum()], dtype=np.int64))[:, 0]
        first = int(counts[: self.rank].sum())
        n_coarse = int(counts.sum())
        coarse_of_label = np.full(owned, -1, dtype=np.int64)
        coarse_of_label[used] = first + np.arange(int(used.sum()), dtype=np.int64)
        coarse = self.lookup(level, label, coarse_of_label)
        nbr_coarse = self.neighbour_values(level, coarse)
        cbounds = _bounds(n_coarse, self.world)
        clo = int(cbounds[self.rank])
        # Contraction, block by block: each block's coarse entries summed here, sent to their owners and
        # summed there again.
        blocks = level.blocks()
        got_keys, got_w = [], []
        for k in range(self.agreed(len(blocks))):
            first, last = blocks[k] if k < len(blocks) else (0, 0)
            au, index, aw = level.block(first, last)
            cu, cv = coarse[au], nbr_coarse[index]
            keep = cu != cv
            keys, w = _sum_by_key(_pair_key(cu[keep], cv[keep], n_coarse), aw[keep])
            del au, index, aw, cu, cv, keep
            edges = self.group.send_to(
                np.searchsorted(cbounds[1:], keys // n_coarse, side="right"), np.stack([keys, w], axis=1), self.msg
            )
            del keys, w
            keys, w = _sum_by_key(edges[:, 0], edges[:, 1])
            got_keys.append(keys)
            got_w.append(w)
            del edges, keys, w
        del nbr_coarse
        keys, w = _sum_by_key(_join(got_keys, np.int64), _join(got_w, np.int64))
        keys -= clo * n_coarse
        vws = self.group.send_to(
            np.searchsorted(cbounds[1:], coarse, side="right"), np.stack([coarse, level.vw], axis=1), self.msg
        )
        vw = np.zeros(int(cbounds[self.rank + 1]) - clo, dtype=np.int64)
        np.add.at(vw, vws[:, 0] - clo, vws[:, 1])
        return _level_from_keys(n_coarse, cbounds, self.rank, vw, keys, w), coarse

    # -- initial partition and refinement ------------------------------------------------------------

    def initial(self, level: Level) -> np.ndarray:
        """METIS on the coarsest level, gathered on rank 0; the parts of the owned vertices."""
        lo = level.lo(self.rank)
        owned = level.vw.shape[0]
        to_root = np.zeros(self.world, dtype=np.int64)
        to_root[0] = level.entries
        au, index, aw = level.block(0, owned)
        rows = np.stack([au + lo, level.nbr[index], aw], axis=1)
        del au, index, aw
        adj, _ = self.group.alltoallv(rows, to_root, self.msg)
        del rows
        to_root[0] = owned
        vw, _ = self.group.alltoallv(level.vw, to_root, self.msg)
        if self.rank == 0:
            # Entries arrive by source rank, each sorted by (vertex, neighbour): already in CSR order.
            xadj = np.zeros(level.n + 1, dtype=np.int64)
            np.cumsum(np.bincount(adj[:, 0], minlength=level.n), out=xadj[1:])
            logger.info("METIS on the coarse graph: %d vertices, %d adjacency entries", level.n, adj.shape[0])
            part, _ = metis_kway(
                xadj,
                np.ascontiguousarray(adj[:, 1]),
                np.ascontiguousarray(vw.reshape(-1, 1)),
                np.ascontiguousarray(adj[:, 2]),
                self.P,
                self.seed,
            )
            dest = level.owner(np.arange(level.n, dtype=np.int64))
            counts = np.bincount(dest, minlength=self.world).astype(np.int64)
        else:
            part, counts = np.empty(0, dtype=np.int64), np.zeros(self.world, dtype=np.int64)
        mine, _ = self.group.alltoallv(part, counts, self.msg)
        return mine

    def refine(self, level: Level, part: np.ndarray, depth: int) -> np.ndarray:
        """Label propagation over parts within the balance bound (see the module docstring)."""
        lo = level.lo(self.rank)
        total = int(self.group.allreduce(np.array([level.vw.sum()], dtype=np.int64))[0])
        max_part = int((1 + IMBALANCE) * total / self.P) + 1
        heaviest = int(self.group.allreduce(np.array([level.vw.max(initial=0)], dtype=np.int64), "max")[0])
        ids = np.arange(lo, lo + part.shape[0], dtype=np.int64)
        part_rank = np.arange(self.P) % self.world
        moved = np.zeros(2, dtype=np.int64)  # vertices moved by the last two rounds (this rank's)
        rounds = 0
        for rnd in range(REFINE_ROUNDS):
            salt = 50_000 + 1000 * depth + rnd
            summed = self.group.allreduce(
                np.concatenate([np.bincount(part, weights=level.vw, minlength=self.P).astype(np.int64), moved])
            )
            weights = summed[: self.P]
            if rnd >= 2 and summed[self.P :].sum() <= STALL_FRACTION * level.n:
                break  # the moves stalled
            rounds = rnd + 1
            over = np.maximum(weights - max_part, 0) / np.maximum(weights, 1)
            nbr_part = self.neighbour_values(level, part)
            active = _unit(ids, self.seed, salt) < 0.5
            room = weights + heaviest <= max_part

            def allowed(vertices, active=active, room=room):
                return active[vertices][:, None] & room[None, :]

            gu, gt, conn, cur = self._best_part(level, nbr_part, part, salt, allowed, active)
            leave = _unit(ids[gu], self.seed, salt + 3) < over[part[gu]]
            move = (conn > cur[gu]) | leave
            gu, gt, gain = gu[move], gt[move], (conn - cur[gu])[move]
            prio = -gain.astype(np.float64) + _unit(ids[gu], self.seed, salt + 7)
            ok = self._accept(part_rank[gt], gt, level.vw[gu], prio, ids[gu], lambda t, w=weights: max_part - w[t])
            part[gu[ok]] = gt[ok]
            moved = np.array([moved[1], np.count_nonzero(ok)], dtype=np.int64)
        logger.info("level %d refined in %d rounds", depth, rounds)
        return part

    def edge_cut(self, level: Level, part: np.ndarray) -> int:
        nbr_part = self.neighbour_values(level, part)
        cut = 0
        for first, last in level.blocks():
            au, index, aw = level.block(first, last)
            cut += int(np.sum(aw[part[au] != nbr_part[index]]))
        return int(self.group.allreduce(np.array([cut], dtype=np.int64))[0]) // 2

    def run(self) -> tuple[np.ndarray, int]:
        levels = [self.level0()]
        maps: list[np.ndarray] = []
        total = self.job.N
        max_cluster = max(1, int(total / self.P * CLUSTER_FRACTION))
        while True:
            level = levels[-1]
            entries = int(self.group.allreduce(np.array([level.entries], dtype=np.int64))[0])
            if entries <= self.coarse_edges or level.n <= 2 * self.P:
                break
            coarse, mapping = self.coarsen(level, len(levels), max_cluster)
            logger.info(
                "level %d: %d vertices, %d adjacency entries -> %d vertices", len(levels), level.n, entries, coarse.n
            )
            if coarse.n > MIN_SHRINK * level.n:
                break
            levels.append(coarse)
            maps.append(mapping)
        part = np.zeros(levels[-1].vw.shape[0], dtype=np.int64) if self.P == 1 else self.initial(levels[-1])
        for depth in range(len(levels) - 1, -1, -1):
            if self.P > 1:
                part = self.refine(levels[depth], part, depth)
            if depth:
                part = self.lookup(levels[depth], maps[depth - 1], part)
        cut = self.edge_cut(levels[0], part) if self.P > 1 else 0
        return part, cut


def multilevel_assignment(job, coarse_edges: int = COARSE_EDGES) -> tuple[np.ndarray, int]:
    """``(part of each node the job's rank owns, edge cut of the symmetrised graph)``."""
    return Multilevel(job, coarse_edges).run()
