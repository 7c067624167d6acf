"""The distributed partition job: W ranks partition a chunked graph none of them reads whole.

Every rank runs :func:`partition_distributed` (under ``--local``, distgnn-launch, torchrun or srun). The
output is the on-disk format of ``partition.format``, identical to what ``partition_graph`` writes for the
same assignment. Work is split three ways:

* **reading**: the edge chunks of all edge types, in (edge type, chunk) order, are split into W contiguous
  runs of about ``E / W`` edges (:func:`edge_chunk_readers`), so the ranks' edges in rank order are the
  edges in original id order; a rank reads the data chunks of its edge chunks, and node data chunk ``j``
  of every node array where ``j % W == r`` (data files must follow ``num_*_per_chunk``);
* **assignment**: rank ``r`` owns the homogeneous node ids ``[r N / W, (r + 1) N / W)``: their partition
  (``random``/``range`` computed per id, ``metis`` from ``partition.multilevel``) and their new id;
* **writing**: rank ``p % W`` writes partition ``p`` (its CSC, HALO, features, its slices of
  ``orig_nid``/``orig_eid``); rank 0 writes the JSON and renames the staged directory into place.

Phases: read edges; assign; number nodes (new ids ordered by (partition, original id), counts gathered);
renumber every edge's ends (from every rank's copy of the new-id table where that table is small beside
the rank's edges, else by lookups at the owners); send each edge to its destination's writer, which
receives them in original id order and sorts them stably by (edge type, new destination), the order of
new edge ids; new edge ids
back to the chunk readers; features chunk by chunk to the writers. Every exchange is
``RankGroup.alltoallv``; what a rank writes goes to its ``.npy`` files by plain writes.
"""

from __future__ import annotations

import functools
import logging
import os
import resource
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from distgnn.data.chunked import ChunkedLayout, read_chunked_layout
from distgnn.data.hetero import DEFAULT_ETYPE, DEFAULT_NTYPE, ChunkedArray, etype_str
from distgnn.errors import InputError
from distgnn.partition.assign import random_assignment, range_assignment
from distgnn.partition.format import (
    PART_ARRAYS,
    FeatureSpec,
    PartInfo,
    PartitionMeta,
    PartitionWriter,
    check_output_dir,
    feature_key,
)
from distgnn.partition.reshuffle import local_indices, stable_order, stable_order_starts
from distgnn.partition.threads import Workers, rank_threads

if TYPE_CHECKING:  # torch is imported by the ranks only
    from distgnn.partition.collective import RankGroup

logger = logging.getLogger(__name__)

DIST_METHODS = ("random", "range", "metis")
# Edge ends renumbered per lookup: bounds the lookup's scratch arrays whatever the edge count.
LOOKUP_SLICE = 1 << 21
# Up to this many bounds, a value's bucket is counted by comparisons instead of a binary search.
FEW_BOUNDS = 16
# Above this many runs of consecutive rows, received feature rows are written through a mapping.
MAX_WRITE_RUNS = 4096
# What a rank holds per edge read while its ends are renumbered and laid out by partition, in ids and int64s
# (``partition.memory``'s estimate counts it), and per edge of an edge chunk being read: its (rows, 2) int64 pairs
# (memory-mapped from a .npy, or parsed) and both ends copied out as int64 columns.
READ_IDS = 5
READ_INT64 = 2
READ_CHUNK_PER_EDGE = 32


@dataclass(frozen=True)
class DistOptions:
    """What a distributed partition job does (the same on every rank)."""

    input: Path
    num_parts: int
    out: Path
    method: str = "random"
    graph_name: str | None = None
    seed: int = 0
    overwrite: bool = False
    message_mb: float = 256.0
    coarse_edges: int = 50_000_000
    renumber: str = "auto"  # auto | table | lookup: see renumber_table_fits
    threads: int = 0  # threads per rank for the array steps; 0: the rank's share of its machine's CPUs

    @property
    def message_bytes(self) -> int:
        return max(1, int(self.message_mb * (1 << 20)))


@dataclass
class RankReport:
    """What one rank did: its peak RSS, the all-to-all rounds it took part in and the bytes it sent."""

    peak_rss_bytes: int
    rounds: int
    bytes_sent: int
    seconds: float


def read_term_bytes(edges_read: int, id_bytes: int, num_etypes: int) -> int:
    """What a rank holds for ``edges_read`` edges while their ends are renumbered and laid out by partition:
    ``READ_IDS`` ids (one more with several edge types) and ``READ_INT64`` int64s an edge (the estimate's read
    term)."""
    return ((READ_IDS + (1 if num_etypes > 1 else 0)) * id_bytes + 8 * READ_INT64) * edges_read


def edge_chunks_at_once(edges_read: int, largest_chunk: int, id_bytes: int, num_etypes: int) -> int:
    """How many edge chunks a rank may read at once within the estimate: the read chunks' arrays (both ends and,
    with several edge types, the type) and ``READ_CHUNK_PER_EDGE`` bytes per edge of each chunk in flight stay
    within :func:`read_term_bytes`; at least one."""
    if largest_chunk <= 0:
        return 1
    columns = 3 if num_etypes > 1 else 2
    room = read_term_bytes(edges_read, id_bytes, num_etypes) - columns * id_bytes * edges_read
    return max(1, room // (READ_CHUNK_PER_EDGE * largest_chunk))


def peak_rss_bytes() -> int:
    """Peak resident memory of this process so far (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def _offsets(counts: list[int]) -> np.ndarray:
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(np.asarray(counts, dtype=np.int64), out=out[1:])
    return out


def _ranges(sizes: np.ndarray) -> np.ndarray:
    ends = np.cumsum(sizes.reshape(-1), dtype=np.int64)
    return np.stack([ends - sizes.reshape(-1), ends], axis=1).reshape(*sizes.shape, 2)


def bucket_of(bounds: np.ndarray, values: np.ndarray, dtype: np.dtype = np.int64) -> np.ndarray:
    """``searchsorted(bounds, values, side="right")`` as ``dtype`` (int64, or one that holds
    ``len(bounds)``) for sorted ``bounds``: with few bounds one comparison pass per bound, else a binary
    search in the values' own dtype (a search across dtypes converts every value first)."""
    bounds = np.asarray(bounds, dtype=np.int64)
    if values.dtype.kind in "iu" and bounds.size:
        limits = np.iinfo(values.dtype)
        if limits.min <= bounds[0] and bounds[-1] <= limits.max:
            bounds = bounds.astype(values.dtype)
    if bounds.size > FEW_BOUNDS:
        return np.searchsorted(bounds, values, side="right").astype(dtype, copy=False)
    out = np.zeros(values.shape, dtype=np.uint8)
    above = np.empty(values.shape, dtype=bool)
    for bound in bounds:
        np.greater_equal(values, bound, out=above)
        out += above
    return out.astype(dtype, copy=False)


def check_chunking(layout: ChunkedLayout) -> None:
    """Data files must follow the chunking, so the reader of a chunk reads its data rows too."""
    for owner, arrays, chunks in [
        *((f"node type {t!r}", layout.ndata.get(t, {}), layout.node_chunks[t]) for t in layout.ntypes),
        *((f"edge type {etype_str(e)!r}", layout.edata.get(e, {}), layout.edge_chunks[e]) for e in layout.etypes),
    ]:
        for name, array in arrays.items():
            if [rows for rows, _ in array.chunks] != list(chunks):
                raise InputError(
                    f"{array.where}: {len(array.chunks)} files that do not follow the {len(chunks)} chunks of "
                    f"{owner}; the distributed job needs one data file per chunk (or use the single-process tool)"
                )
            if name == "reverse_eid":
                raise InputError(
                    f"{array.where}: an edge array 'reverse_eid' needs the single-process tool (drop --workers)"
                )


def _load_chunk(array: ChunkedArray, index: int) -> np.ndarray:
    rows, load = array.chunks[index]
    chunk = np.asarray(load())
    if chunk.shape != (rows, *array.row_shape) or chunk.dtype != array.dtype:
        raise InputError(
            f"{array.where}: chunk {index} is {chunk.dtype}{list(chunk.shape)}, expected "
            f"{array.dtype}{[rows, *array.row_shape]}"
        )
    return chunk


def _pwrite_all(fd: int, data: memoryview, at: int) -> None:
    while data:
        done = os.pwrite(fd, data, at)
        data, at = data[done:], at + done


class _Arange:
    """``np.arange(start, stop)`` (int64) for :func:`_write_rows`, made a slice at a time."""

    def __init__(self, start: int, stop: int):
        self.start, self.shape = start, (stop - start,)

    def __getitem__(self, where: slice) -> np.ndarray:
        lo, hi, _ = where.indices(self.shape[0])
        return np.arange(self.start + lo, self.start + hi, dtype=np.int64)


def _place_by_new_id(
    out: np.ndarray, pairs: np.ndarray, shift: np.ndarray, part_ends: np.ndarray, span: tuple[int, int]
) -> None:
    """Rows ``span`` of ``pairs`` (new id, value): each value into ``out[new id - shift[its partition]]``, the
    partition being how many of ``part_ends`` (the ends of every partition's new ids but the last's) are at or
    below the id."""
    new = pairs[span[0] : span[1], 0]
    out[new - shift[bucket_of(part_ends, new)]] = pairs[span[0] : span[1], 1]


def _write_rows(path: Path, length: int, first: int, values: np.ndarray | _Arange) -> None:
    """Write ``values`` as int64 rows ``first ..`` of the ``(length,)`` int64 ``.npy`` file ``path``, a slice
    at a time (plain writes: nothing of the file stays mapped in this process)."""
    header = path.stat().st_size - 8 * length
    fd = os.open(path, os.O_WRONLY)
    try:
        for k in range(0, values.shape[0], LOOKUP_SLICE):
            piece = np.ascontiguousarray(values[k : k + LOOKUP_SLICE], dtype="<i8")
            _pwrite_all(fd, memoryview(piece).cast("B"), header + 8 * (first + k))
    finally:
        os.close(fd)


def _save_npy(path: Path, array: np.ndarray) -> None:
    np.save(path, np.ascontiguousarray(array), allow_pickle=False)


def _write_arange(path: Path, start: int, stop: int) -> None:
    """A new ``(stop - start,)`` int64 ``.npy`` file ``path`` holding ``start .. stop - 1``, a slice at a time."""
    create_npy(path, np.int64, (stop - start,))
    _write_rows(path, stop - start, 0, _Arange(start, stop))


def _write_at(path: Path, length: int, positions: np.ndarray, rows: np.ndarray) -> None:
    """``rows`` into rows ``positions`` of the ``(length, ...)`` ``.npy`` file ``path`` (its dtype and row
    shape): runs of consecutive positions by plain writes (node data: a chunk's rows of one partition are
    one run), scattered positions through a mapping dropped at once."""
    if positions.shape[0] == 0:
        return
    breaks = np.flatnonzero(np.diff(positions) != 1) + 1
    if breaks.shape[0] > MAX_WRITE_RUNS:
        out = np.load(path, mmap_mode="r+")
        out[positions] = rows
        del out  # unmapped without a sync: the pages reach the file as plain writes' do
        return
    row_bytes = rows.dtype.itemsize * int(np.prod(rows.shape[1:], dtype=np.int64))
    header = path.stat().st_size - row_bytes * length
    fd = os.open(path, os.O_WRONLY)
    try:
        for a, b in zip([0, *breaks.tolist()], [*breaks.tolist(), positions.shape[0]], strict=True):
            data = memoryview(np.ascontiguousarray(rows[a:b])).cast("B")
            _pwrite_all(fd, data, header + row_bytes * int(positions[a]))
    finally:
        os.close(fd)


def _column_minus(rows: np.ndarray, column: int, value: int, workers: Workers) -> np.ndarray:
    """``rows[:, column] - value`` as int64, a piece per thread."""
    out = np.empty(rows.shape[0], dtype=np.int64)
    workers.run(
        lambda r: np.subtract(rows[r[0] : r[1], column], value, out=out[r[0] : r[1]], dtype=np.int64),
        workers.pieces(len(out)),
    )
    return out


def create_npy(path: Path, dtype: np.dtype, shape: tuple[int, ...]) -> None:
    """A new ``.npy`` file of ``dtype`` and ``shape``, its data zeros (a sparse file, filled later by plain
    writes): no mapping, so no synchronous write to the disk as a mapping's flush would do."""
    dtype = np.dtype(dtype)
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": tuple(shape)}
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        f.truncate(f.tell() + dtype.itemsize * int(np.prod(shape, dtype=np.int64)))


def edge_chunk_readers(layout: ChunkedLayout, world: int) -> dict[tuple, np.ndarray]:
    """The rank that reads each edge chunk, per edge type: the chunks of all edge types in (edge type,
    chunk) order split into ``world`` contiguous runs, a chunk going to the rank whose ``E / world`` share
    of the edges holds its middle edge."""
    sizes = [np.asarray(layout.edge_chunks[e], dtype=np.int64) for e in layout.etypes]
    flat = np.concatenate(sizes) if sizes else np.empty(0, dtype=np.int64)
    total = max(int(flat.sum()), 1)
    middle = np.cumsum(flat) - flat + flat // 2
    readers = np.minimum(middle * world // total, world - 1)
    cuts = np.cumsum([len(x) for x in sizes])[:-1]
    return dict(zip(layout.etypes, np.split(readers, cuts), strict=True))


def renumber_table_fits(num_nodes: int, num_edges: int, world: int) -> bool:
    """Whether every rank holds the whole new-id table (4 or 8 bytes a node) to renumber edge ends: where
    it is no larger than one int64 column of a rank's share of the edges; else ends are looked up at their
    owners."""
    return table_dtype(num_nodes).itemsize * num_nodes <= 8 * (num_edges // max(world, 1))


def uses_table(renumber: str, num_nodes: int, num_edges: int, world: int) -> bool:
    """Whether the job renumbers from the table (``renumber``: auto, table or lookup)."""
    return renumber == "table" or (renumber == "auto" and renumber_table_fits(num_nodes, num_edges, world))


def table_dtype(num_nodes: int) -> np.dtype:
    return np.dtype(np.int32) if num_nodes <= np.iinfo(np.int32).max else np.dtype(np.int64)


class _Job:
    """One rank's state through the phases."""

    def __init__(self, opts: DistOptions, group: RankGroup, layout: ChunkedLayout):
        self.opts, self.group, self.layout = opts, group, layout
        self.rank, self.world, self.P = group.rank, group.world, opts.num_parts
        self.ntypes = layout.ntypes
        self.etypes = layout.etypes
        self.node_offsets = _offsets([layout.num_nodes[t] for t in self.ntypes])
        self.edge_offsets = _offsets([layout.num_edges(e) for e in self.etypes])
        self.N, self.E = int(self.node_offsets[-1]), int(self.edge_offsets[-1])
        self.owner_bounds = np.array([r * self.N // self.world for r in range(self.world + 1)], dtype=np.int64)
        self.own_lo, self.own_hi = (int(x) for x in self.owner_bounds[self.rank : self.rank + 2])
        self.my_parts = list(range(self.rank, self.P, self.world))
        self.edge_readers = edge_chunk_readers(layout, self.world)
        self.new_table: np.ndarray | None = None  # every node's new id, where renumber_table_fits
        # Node and edge ids as held and sent in the edge phase.
        self.id_dtype = table_dtype(max(self.N, self.E, len(self.etypes)))
        self.workers = Workers(opts.threads or rank_threads())

    # -- helpers ------------------------------------------------------------------------------------

    def node_owner(self, ids: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.owner_bounds[1:], ids, side="right")

    def part_of_new(self, new_ids: np.ndarray) -> np.ndarray:
        return bucket_of(self.node_map[:-1, 1], new_ids)

    def my_chunks(self, num_chunks: int) -> list[int]:
        return list(range(self.rank, num_chunks, self.world))

    def my_edge_chunks(self, etype: tuple) -> list[int]:
        return np.flatnonzero(self.edge_readers[etype] == self.rank).tolist()

    def edge_pieces(self) -> list[tuple[int, int]]:
        """``(edge type index, chunk)`` this rank reads, in original edge id order."""
        return [(t, j) for t, etype in enumerate(self.etypes) for j in self.my_edge_chunks(etype)]

    # -- phases ----------------------------------------------------------------------------------

    def read_edges(self) -> None:
        """This rank's edge chunks in homogeneous ids (``id_dtype``): ``src``, ``dst`` and, with several
        edge types, ``etype``. The chunks are a contiguous run of the original edge ids from ``first_eid``;
        they are read on the rank's threads, as many at once as :func:`edge_chunks_at_once` allows, each into
        its own rows."""
        pieces = self.edge_pieces()
        rows = [self.layout.edge_chunks[self.etypes[t]][j] for t, j in pieces]
        starts = _offsets(rows).tolist()
        total = starts[-1]
        self.src, self.dst = (np.empty(total, dtype=self.id_dtype) for _ in range(2))
        self.etype = np.empty(total, dtype=self.id_dtype) if len(self.etypes) > 1 else None
        # (etype, chunk) -> first row in the rank's arrays
        self.edge_chunk_pos: dict[tuple[int, int], int] = dict(zip(pieces, starts[:-1], strict=True))
        self.first_eid = 0
        if pieces:
            t, j = pieces[0]
            self.first_eid = int(self.edge_offsets[t] + _offsets(self.layout.edge_chunks[self.etypes[t]])[j])

        def read(k: int) -> None:
            t, j = pieces[k]
            etype, at, n = self.etypes[t], starts[k], rows[k]
            s, d = self.layout.read_edge_chunk(etype, j)
            np.add(s, self.node_offsets[self.ntypes.index(etype[0])], out=self.src[at : at + n], casting="unsafe")
            np.add(d, self.node_offsets[self.ntypes.index(etype[2])], out=self.dst[at : at + n], casting="unsafe")
            if self.etype is not None:
                self.etype[at : at + n] = t

        at_once = edge_chunks_at_once(total, max(rows, default=0), self.id_dtype.itemsize, len(self.etypes))
        self.workers.run(read, range(len(pieces)), at_once=at_once)
        self.num_read = total

    def assign(self) -> None:
        ids = np.arange(self.own_lo, self.own_hi, dtype=np.int64)
        if self.opts.method == "random":
            # A node's part depends on its id alone: pieces of the owned ids on the rank's threads.
            part = np.empty(len(ids), dtype=np.int64)

            def assign_piece(span: tuple[int, int]) -> None:
                lo, hi = span
                part[lo:hi] = random_assignment(self.N, self.P, self.opts.seed, ids=ids[lo:hi])

            self.workers.run(assign_piece, self.workers.pieces(len(ids)))
            self.part_owned = part
        elif self.opts.method == "range":
            self.part_owned = range_assignment([self.layout.num_nodes[t] for t in self.ntypes], self.P, ids=ids)
        else:
            from distgnn.partition.multilevel import multilevel_assignment

            self.part_owned, self.edge_cut = multilevel_assignment(self, self.opts.coarse_edges)

    def number_nodes(self) -> None:
        """New ids of the owned nodes: ordered by (partition, original id) over all ranks."""
        part = self.part_owned
        mine = np.bincount(part, minlength=self.P).astype(np.int64)
        counts = self.group.allgather(mine)  # (W, P)
        sizes = counts.sum(axis=0)
        starts = _offsets(sizes.tolist())
        self.node_map = np.stack([starts[:-1], starts[1:]], axis=1)
        # The owned nodes in (partition, original id) order; the one at position i of that order, in partition
        # p, gets p's first new id for this rank plus its rank among this rank's nodes of p.
        shift = starts[:-1] + counts[: self.rank].sum(axis=0) - _offsets(mine.tolist())[:-1]
        order = self.workers.order_by_key(part, self.P)
        new = np.empty(len(part), dtype=np.int64)

        def number(r: tuple[int, int]) -> None:
            at = order[r[0] : r[1]]
            new[at] = shift[part[at]] + np.arange(r[0], r[1], dtype=np.int64)

        self.workers.run(number, self.workers.pieces(len(part)))
        self.new_owned = new
        ids = np.arange(self.own_lo, self.own_hi, dtype=np.int64)
        ntype = np.searchsorted(self.node_offsets[1:], ids, side="right")
        T = len(self.ntypes)
        type_counts = np.bincount(part * T + ntype, minlength=self.P * T).astype(np.int64)
        self.node_type_ranges = _ranges(self.group.allreduce(type_counts).reshape(self.P, T))
        if uses_table(self.opts.renumber, self.N, self.E, self.world):
            owned = np.diff(self.owner_bounds)
            self.new_table = self.group.allgather_rows(
                new.astype(table_dtype(self.N), copy=False), owned, self.opts.message_bytes
            )

    def new_node_ids(self, ids: np.ndarray) -> np.ndarray:
        """New ids of any homogeneous node ids (a collective where the ranks hold no table)."""
        if self.new_table is not None:
            return self.new_table[ids].astype(np.int64, copy=False)
        return self.group.lookup(
            ids, self.node_owner(ids), lambda asked: self.new_owned[asked - self.own_lo], self.opts.message_bytes
        )

    def _renumber_in_place(self, ids: np.ndarray) -> None:
        """Replace homogeneous node ids by their new ids, ``LOOKUP_SLICE`` at a time (a collective where
        the ranks hold no table)."""
        if self.new_table is not None:

            def renumber(r: tuple[int, int]) -> None:
                for k in range(r[0], r[1], LOOKUP_SLICE):
                    piece = ids[k : min(k + LOOKUP_SLICE, r[1])]
                    piece[:] = self.new_table[piece]

            self.workers.run(renumber, self.workers.pieces(len(ids)))
            return
        slices = int(self.group.allreduce(np.array([-(-len(ids) // LOOKUP_SLICE)], dtype=np.int64), "max")[0])
        for k in range(slices):
            piece = ids[k * LOOKUP_SLICE : (k + 1) * LOOKUP_SLICE]
            piece[:] = self.new_node_ids(piece)

    def dispatch_edges(self, staging: Path) -> None:
        """Each edge to the writer of its destination's partition, which numbers its edges and writes its
        CSC, HALO and slices of ``orig_eid``/``orig_nid``; new edge ids go back to the readers of the
        edges' chunks when there is edge data. Partitions ``k W .. (k + 1) W - 1`` travel in step ``k``,
        so a writer holds one partition's edges at a time, and the rank's own edges are dropped before
        the last partition is written."""
        R = len(self.etypes)
        clock = _Steps()
        self._renumber_in_place(self.src)
        self._renumber_in_place(self.dst)
        clock.done("renumber")
        # each edge's partition, as uint8 where the partitions fit it (the order's keys)
        part = np.empty(len(self.dst), dtype=np.uint8 if self.P <= (1 << 8) else np.int64)

        def partitions(r: tuple[int, int], part: np.ndarray = part) -> None:
            part[r[0] : r[1]] = bucket_of(self.node_map[:-1, 1], self.dst[r[0] : r[1]], part.dtype)

        self.workers.run(partitions, self.workers.pieces(len(part)))
        del partitions  # (it holds part)

        def count(r: tuple[int, int], part: np.ndarray = part) -> np.ndarray:
            keys = part[r[0] : r[1]]
            if R > 1:
                keys = keys.astype(np.int64) * R + self.etype[r[0] : r[1]]
            return np.bincount(keys, minlength=self.P * R)

        # this rank's edges per (partition, edge type), a piece per thread
        mine = np.sum(self.workers.run(count, self.workers.pieces(len(part))), axis=0, dtype=np.int64)
        del count
        mine = mine.reshape(self.P, R)
        counts = self.group.allreduce(mine)
        ends = _offsets(counts.sum(axis=1).tolist())
        self.edge_map = np.stack([ends[:-1], ends[1:]], axis=1)
        self.edge_type_ranges = _ranges(counts)
        order = self.workers.order_by_key(part, self.P)  # by partition
        per_part = mine.sum(axis=1)
        del part
        # Rows (new source, new destination, original edge id[, edge type]) ordered by partition. (The
        # order's positions are valid: take's "clip" mode gathers in place, "raise" through a buffer.)
        rows = np.empty((len(order), 4 if R > 1 else 3), dtype=self.id_dtype)
        self.workers.take(self.src, order, rows[:, 0])
        self.src = None
        self.workers.take(self.dst, order, rows[:, 1])
        self.dst = None
        if R > 1:
            self.workers.take(self.etype, order, rows[:, 3])
            self.etype = None

        def original_eids(r: tuple[int, int], order: np.ndarray = order, rows: np.ndarray = rows) -> None:
            for k in range(r[0], r[1], LOOKUP_SLICE):
                hi = min(k + LOOKUP_SLICE, r[1])
                np.add(order[k:hi], self.first_eid, out=rows[k:hi, 2], casting="unsafe")

        self.workers.run(original_eids, self.workers.pieces(len(order)))
        del original_eids  # (it holds order and rows, dropped below)
        del order
        clock.done("order")
        starts = _offsets(per_part.tolist())
        self.part_counts: dict[int, tuple[int, int, int]] = {}
        back_eid, back_new = [], []
        keep_new_eids = any(self.layout.edata.get(e) for e in self.etypes)
        steps = -(-self.P // self.world)
        for k in range(steps):
            first, last = k * self.world, min((k + 1) * self.world, self.P)
            dest_counts = np.zeros(self.world, dtype=np.int64)
            dest_counts[: last - first] = per_part[first:last]
            if self.world == 1:  # the partition's rows are this rank's own: read in place, no copy
                edges = rows[starts[first] : starts[last]]
            else:
                edges, _ = self.group.alltoallv(
                    rows[starts[first] : starts[last]], dest_counts, self.opts.message_bytes
                )
            clock.done("exchange")
            if k == steps - 1:
                rows = None
            p = first + self.rank
            if p >= last:
                continue
            # Received in original edge id order (the readers' runs in rank order): a stable sort by
            # (edge type, new destination) gives (edge type, new destination, original id), the order
            # of new edge ids.
            n0, num_owned = int(self.node_map[p, 0]), int(self.node_map[p, 1] - self.node_map[p, 0])
            key = _column_minus(edges, 1, n0, self.workers)
            if R > 1:
                key += edges[:, 3].astype(np.int64) * num_owned
            if R == 1:  # the sorted keys give the CSC's indptr
                by, indptr = stable_order_starts(key, num_owned, self.workers)
            else:
                by = stable_order(key, num_owned * R, self.workers)
            del key
            clock.done("sort")
            e0, e1 = (int(x) for x in self.edge_map[p])
            eids = self.workers.gather(edges[:, 2], by)
            # the partition's files are written on the pool's threads beside its next steps
            writes = [self.workers.start(_write_rows, staging / "orig_eid.npy", self.E, e0, eids)]
            if keep_new_eids:
                back_eid.append(eids.astype(np.int64))
                back_new.append(np.arange(e0, e1, dtype=np.int64))
            del eids
            srcs = self.workers.gather(edges[:, 0], by)
            if R == 1:
                del edges, by
                clock.done("gather")
                self._write_part(staging, p, srcs, clock, writes, indptr=indptr)
                del indptr
            else:
                dsts, types = self.workers.gather(edges[:, 1], by), self.workers.gather(edges[:, 3], by)
                del edges, by
                clock.done("gather")
                self._write_part(staging, p, srcs, clock, writes, dsts=dsts, types=types)
            for written in writes:
                written()
            del writes
            clock.done("write")
        del rows
        # orig_nid: the owners send (new id, original id) to the writers, which place each original id at its
        # new id's row of their parts' rows (laid end to end), a piece of the pairs per thread.
        ids = np.arange(self.own_lo, self.own_hi, dtype=np.int64)
        pairs = self.group.send_to(
            self.part_of_new(self.new_owned) % self.world,
            np.stack([self.new_owned, ids], axis=1),
            self.opts.message_bytes,
        )
        del ids
        spans = [(int(self.node_map[p][0]), int(self.node_map[p][1])) for p in self.my_parts]
        firsts = np.cumsum([0] + [n1 - n0 for n0, n1 in spans])
        shift = np.zeros(self.P, dtype=np.int64)  # new id - shift[its part] = its row in `orig`
        shift[self.my_parts] = [n0 - int(at) for (n0, _), at in zip(spans, firsts[:-1], strict=True)]
        orig = np.empty(int(firsts[-1]), dtype=np.int64)
        place = functools.partial(_place_by_new_id, orig, pairs, shift, self.node_map[:-1, 1])
        self.workers.run(place, self.workers.pieces(pairs.shape[0]))
        del pairs, place
        for (n0, n1), at in zip(spans, firsts[:-1], strict=True):
            _write_rows(staging / "orig_nid.npy", self.N, n0, orig[at : at + n1 - n0])
        del orig
        clock.done("orig_nid")
        if keep_new_eids:
            old = np.concatenate(back_eid) if back_eid else np.empty(0, dtype=np.int64)
            new = np.concatenate(back_new) if back_new else np.empty(0, dtype=np.int64)
            reader, local = self._edge_reader(old)
            got = self.group.send_to(reader, np.stack([local, new], axis=1), self.opts.message_bytes)
            self.new_eid_of_mine = np.empty(self.num_read, dtype=np.int64)
            self.new_eid_of_mine[got[:, 0]] = got[:, 1]
        clock.done("ids back")
        logger.info("rank %d: dispatch steps (wall / CPU s): %s", self.rank, clock)

    def _write_part(
        self,
        staging: Path,
        p: int,
        srcs: np.ndarray,
        clock: _Steps,
        writes: list[Callable[[], object]],
        indptr: np.ndarray | None = None,
        dsts: np.ndarray | None = None,
        types: np.ndarray | None = None,
    ) -> None:
        """Partition ``p``'s CSC arrays from its edges in new-edge-id order: new ids of the sources, and
        with one edge type the CSC's indptr over the owned nodes, with several the new destinations and types.
        Each array's write begins as soon as it is complete (:meth:`Workers.start`; each one's end is added to
        ``writes``)."""
        R = len(self.etypes)
        n0, n1 = (int(x) for x in self.node_map[p])
        e0, e1 = (int(x) for x in self.edge_map[p])
        num_owned = n1 - n0
        where = staging / f"part{p}"
        where.mkdir(parents=True, exist_ok=True)

        def save(name: str, array: np.ndarray) -> None:
            writes.append(self.workers.start(_save_npy, where / f"{name}.npy", array))

        eid_order = None
        if R > 1:
            csc_rows = (dsts.astype(np.int64) - n0) * R + types
            del dsts, types
            indptr = np.zeros(num_owned * R + 1, dtype=np.int64)
            np.cumsum(np.bincount(csc_rows, minlength=num_owned * R), out=indptr[1:])
            eid_order = stable_order(csc_rows, num_owned * R)
            del csc_rows
            srcs = srcs[eid_order]
            clock.done("sort")
        save("indptr", indptr)
        del indptr
        halo, indices = local_indices(srcs, n0, n1, self.N, self.workers)
        del srcs
        clock.done("local ids")
        save("indices", indices)
        del indices
        save("local2global", np.concatenate([np.arange(n0, n1, dtype=np.int64), halo]))
        if eid_order is None:  # the new edge ids in order
            writes.append(self.workers.start(_write_arange, where / "eids.npy", e0, e1))
        else:
            save("eids", np.arange(e0, e1, dtype=np.int64)[eid_order])
        del eid_order
        self.part_counts[p] = (num_owned, len(halo), e1 - e0)
        logger.info("part %d: %d owned, %d halo nodes, %d edges", p, num_owned, len(halo), e1 - e0)

    def _edge_reader(self, eids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(reader rank, row in that reader's arrays)`` of original edge ids."""
        starts, readers, firsts = [], [], []
        # A reader's arrays hold its chunks in (type, chunk) order: the row of each chunk's first edge there.
        filled = np.zeros(self.world, dtype=np.int64)
        for t, etype in enumerate(self.etypes):
            offsets = _offsets(self.layout.edge_chunks[etype])
            for j, rows in enumerate(self.layout.edge_chunks[etype]):
                r = int(self.edge_readers[etype][j])
                starts.append(int(self.edge_offsets[t] + offsets[j]))
                readers.append(r)
                firsts.append(int(filled[r]))
                filled[r] += rows
        starts_a, readers_a, firsts_a = (np.asarray(x, dtype=np.int64) for x in (starts, readers, firsts))
        chunk = np.searchsorted(starts_a, eids, side="right") - 1
        return readers_a[chunk], firsts_a[chunk] + eids - starts_a[chunk]

    def scatter_node_features(self, staging: Path, node_specs: dict[str, FeatureSpec]) -> None:
        """Node data chunk by chunk to the writers: the rows of one chunk in one partition have consecutive
        new ids (new ids follow (partition, original id), a chunk is a run of original ids), so a chunk
        travels as its rows ordered by partition plus, per partition, a count and a first new id, and a
        writer writes what it receives as runs, straight from its receive buffer."""
        slots = -(-self.P // self.world)  # partitions per writer
        slot_order = self._slot_order()
        for t, ntype in enumerate(self.ntypes):
            arrays = self.layout.ndata.get(ntype, {})
            if not arrays:
                continue
            chunks = self.layout.node_chunks[ntype]
            offsets = _offsets(chunks) + self.node_offsets[t]
            mine = self.my_chunks(len(chunks))
            rounds = -(-len(chunks) // self.world)
            # Per round k: this rank's chunk's rows ordered by (writer, partition), and each partition's
            # row count and first new id, runs[k, p]; gathered from every rank: runs[src, k, p].
            orders, runs = [], np.zeros((rounds, self.P, 2), dtype=np.int64)
            ids = self.new_node_ids(
                np.concatenate([np.arange(offsets[j], offsets[j + 1], dtype=np.int64) for j in mine])
                if mine
                else np.empty(0, dtype=np.int64)
            )
            at = 0
            for k, j in enumerate(mine):
                new = ids[at : at + chunks[j]]
                at += chunks[j]
                part = self.part_of_new(new)
                order = self.group.order_by_rank((part % self.world) * slots + part // self.world)
                count = np.bincount(part, minlength=self.P)
                runs[k, :, 0] = count
                group_start = _offsets(count[slot_order].tolist())[:-1]  # each partition's first row in order
                present = count[slot_order] > 0
                runs[k, slot_order[present], 1] = new[order[group_start[present]]]
                orders.append(order)
            del ids
            runs = self.group.allgather(runs)  # (W, rounds, P, 2)
            for name, array in arrays.items():
                key = feature_key(ntype, name, DEFAULT_NTYPE)
                node_specs[key] = FeatureSpec(str(array.dtype), tuple(int(d) for d in array.shape))
                self._scatter_runs(staging, f"node_feat/{key}", array, mine, orders, runs, t)

    def _slot_order(self) -> np.ndarray:
        """The partitions in the order they travel: by writer rank, then by their slot on that writer."""
        parts = np.arange(self.P)
        return parts[np.lexsort((parts // self.world, parts % self.world))]

    def _scatter_runs(
        self,
        staging: Path,
        rel: str,
        array: ChunkedArray,
        mine: list[int],
        orders: list[np.ndarray],
        runs: np.ndarray,
        t: int,
    ) -> None:
        """One node array of type ``t`` to the writers (see :meth:`scatter_node_features`); ``orders[k]``:
        the rows of this rank's ``k``-th chunk by (writer, partition); ``runs[src, k, p]``: count and
        first new id of partition ``p``'s rows in rank ``src``'s ``k``-th chunk."""
        W, rounds = self.world, runs.shape[1]
        row_shape = tuple(array.row_shape)
        row_bytes = array.dtype.itemsize * int(np.prod(row_shape, dtype=np.int64))
        first_of_type = self.node_type_ranges[:, t, 0]
        files = {}
        try:
            for p in self.my_parts:
                path = staging / f"part{p}" / f"{rel}.npy"
                path.parent.mkdir(parents=True, exist_ok=True)
                count = int(self.node_type_ranges[p, t, 1] - first_of_type[p])
                create_npy(path, array.dtype, (count, *row_shape))
                files[p] = (os.open(path, os.O_WRONLY), path.stat().st_size - row_bytes * count)
            largest = max((len(o) for o in orders), default=0)
            send = np.empty((largest, *row_shape), dtype=array.dtype)
            recv = None
            writer_of = np.arange(self.P) % W
            # the next chunk is read on a pool thread while this one is exchanged and written
            loading = self.workers.later(_load_chunk, array, mine[0]) if mine else None
            for k in range(rounds):
                n = 0
                if k < len(mine):
                    block = loading()
                    loading = self.workers.later(_load_chunk, array, mine[k + 1]) if k + 1 < len(mine) else None
                    n = len(block)
                    self.workers.take(block, orders[k], send[:n])
                    del block
                counts = np.zeros((W, W), dtype=np.int64)  # counts[src, dst]
                for src in range(W):
                    counts[src] = np.bincount(writer_of, weights=runs[src, k, :, 0], minlength=W)
                # Per source, this rank's partitions in slot order: where each one's rows start in what the
                # source sends it.
                mine_counts = runs[:, k, self.my_parts, 0]  # (W, my parts)
                mine_starts = np.cumsum(mine_counts, axis=1) - mine_counts
                for got, first, got_n in self.group.alltoallv_rounds(send[:n], counts, self.opts.message_bytes, recv):
                    recv = got.base if got.base is not None else got  # got: a leading slice of the buffer, kept
                    writes = []  # (file, its offset, rows of got): one run each, written on the threads
                    at = 0
                    for src in range(W):
                        lo, hi = int(first[src]), int(first[src] + got_n[src])
                        for i, p in enumerate(self.my_parts):
                            a = max(lo, int(mine_starts[src, i]))
                            b = min(hi, int(mine_starts[src, i] + mine_counts[src, i]))
                            if a >= b:
                                continue
                            fd, header = files[p]
                            row = int(runs[src, k, p, 1] - first_of_type[p]) + a - int(mine_starts[src, i])
                            writes.append((fd, header + row_bytes * row, at + a - lo, at + b - lo))
                        at += hi - lo
                    self.workers.run(
                        lambda w, got=got: _pwrite_all(w[0], memoryview(got[w[2] : w[3]]).cast("B"), w[1]), writes
                    )
        finally:
            for fd, _ in files.values():
                os.close(fd)

    def scatter_edge_features(self, staging: Path, edge_specs: dict[str, FeatureSpec]) -> None:
        for t, etype in enumerate(self.etypes):
            arrays = self.layout.edata.get(etype, {})
            if not arrays:
                continue
            chunks = self.layout.edge_chunks[etype]
            mine = self.my_edge_chunks(etype)
            new_of_chunk = {
                j: self.new_eid_of_mine[self.edge_chunk_pos[(t, j)] : self.edge_chunk_pos[(t, j)] + chunks[j]]
                for j in mine
            }
            slots = int(np.bincount(self.edge_readers[etype], minlength=self.world).max(initial=0))
            ranges = self.edge_type_ranges[:, t]
            for name, array in arrays.items():
                key = feature_key(etype_str(etype), name, etype_str(DEFAULT_ETYPE))
                edge_specs[key] = FeatureSpec(str(array.dtype), tuple(int(d) for d in array.shape))
                self._scatter(
                    staging, self.edge_map, f"edge_feat/{key}", array, (mine, slots), new_of_chunk, ranges[:, 0], ranges
                )

    def _scatter(
        self,
        staging: Path,
        id_map: np.ndarray,
        rel: str,
        array: ChunkedArray,
        chunks: tuple[list[int], int],
        new_of_chunk: dict[int, np.ndarray],
        first: np.ndarray,
        ranges: np.ndarray,
    ) -> None:
        """Rows of ``array`` (read chunk by chunk) to the writers; ``chunks``: this rank's chunks and the
        most chunks any rank has (the rounds); ``new_of_chunk``: new homogeneous id of
        every row of this rank's chunks; ``id_map``: ``(P, 2)`` partition ranges of those ids; ``ranges``: ``(P, 2)`` the type's new-id range per partition."""
        row = np.dtype([("id", "<i8"), ("row", array.dtype, array.row_shape)])
        outs = {}
        for p in self.my_parts:
            path = staging / f"part{p}" / f"{rel}.npy"
            path.parent.mkdir(parents=True, exist_ok=True)
            count = int(ranges[p, 1] - ranges[p, 0])
            create_npy(path, array.dtype, (count, *array.row_shape))
            outs[p] = (path, count)
        mine, slots = chunks
        for k in range(slots):
            if k < len(mine):
                j = mine[k]
                block = _load_chunk(array, j)
                packed = np.empty(len(block), dtype=row)
                packed["id"] = new_of_chunk[j]
                packed["row"] = block
                del block
            else:
                packed = np.empty(0, dtype=row)
            dest = np.searchsorted(id_map[:, 1], packed["id"], side="right") % self.world
            got = self.group.send_to(dest, packed, self.opts.message_bytes)
            del packed
            part = np.searchsorted(id_map[:, 1], got["id"], side="right")
            for p in np.unique(part).tolist():
                sel = got[part == p]
                _write_at(*outs[p], sel["id"] - first[p], sel["row"])
            del got


def partition_distributed(opts: DistOptions, group: RankGroup) -> tuple[Path, RankReport]:
    """Run this rank's share of the job; returns the JSON path (written by rank 0, on a filesystem every rank
    sees) and what this rank did.

    Raises:
        InputError: bad input (every rank reads the metadata and raises the same error).
    """
    start = time.perf_counter()
    layout = read_chunked_layout(opts.input)
    check_chunking(layout)
    graph_name = opts.graph_name or layout.graph_name
    out_dir = opts.out.resolve()
    total_nodes = sum(layout.num_nodes.values())
    if opts.method not in DIST_METHODS:
        raise InputError(f"unknown partition method {opts.method!r}; expected one of {', '.join(DIST_METHODS)}")
    if not 1 <= opts.num_parts <= max(total_nodes, 1):
        raise InputError(f"num_parts must be between 1 and the node count {total_nodes}, got {opts.num_parts}")
    check_output_dir(out_dir, graph_name, opts.overwrite)
    job = _Job(opts, group, layout)
    writer = PartitionWriter(out_dir, graph_name, opts.overwrite) if group.rank == 0 else None
    try:
        staging = Path(group.broadcast_json(str(writer.staging) if writer else None))
        group.set_cleanup(lambda: shutil.rmtree(staging, ignore_errors=True))
        if writer is not None:
            create_npy(staging / "orig_nid.npy", np.int64, (job.N,))
            create_npy(staging / "orig_eid.npy", np.int64, (job.E,))
        job.edge_cut = None
        # The assignment first: METIS-based reads the edges itself, a piece at a time.
        _phase(group, f"{opts.method} assignment into {opts.num_parts}", job.assign)
        _phase(group, "read edges", job.read_edges)
        _phase(group, "number nodes", job.number_nodes)
        group.barrier()  # orig_*.npy exist
        _phase(group, "dispatch edges and write partitions", lambda: job.dispatch_edges(staging))
        node_specs: dict[str, FeatureSpec] = {}
        edge_specs: dict[str, FeatureSpec] = {}
        _phase(group, "node features", lambda: job.scatter_node_features(staging, node_specs))
        _phase(group, "edge features", lambda: job.scatter_edge_features(staging, edge_specs))
        counts = np.zeros((opts.num_parts, 3), dtype=np.int64)
        for p, c in job.part_counts.items():
            counts[p] = c
        counts = group.allreduce(counts)
        group.barrier()  # every file is written
        json_path = out_dir / f"{graph_name}.json"
        if writer is not None:
            meta = _meta(job, graph_name, out_dir, counts, node_specs, edge_specs)
            json_path = writer.commit(meta)
        group.barrier()  # committed
    except BaseException:
        job.workers.close()  # the rank's writes still running end before their files are removed
        if writer is not None:
            writer.__exit__(None, None, None)
        raise
    finally:
        job.workers.close()
    return json_path, RankReport(peak_rss_bytes(), group.rounds, group.bytes_sent, time.perf_counter() - start)


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class _Steps:
    """Wall and CPU seconds (the process's, every thread) of a phase's steps, summed by name in the order
    first seen."""

    def __init__(self):
        self.seconds: dict[str, list[float]] = {}
        self.last = (time.perf_counter(), _cpu_seconds())

    def done(self, name: str) -> None:
        now = (time.perf_counter(), _cpu_seconds())
        total = self.seconds.setdefault(name, [0.0, 0.0])
        total[0] += now[0] - self.last[0]
        total[1] += now[1] - self.last[1]
        self.last = now

    def __str__(self) -> str:
        return ", ".join(f"{name} {wall:.2f} / {cpu:.2f}" for name, (wall, cpu) in self.seconds.items())


def _phase(group: RankGroup, name: str, step) -> None:
    start, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    step()
    after = resource.getrusage(resource.RUSAGE_SELF)
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    logger.info(
        "rank %d: %s done in %.1f s, CPU %.1f s (system %.1f s, %d minor faults; peak RSS so far %.2f GiB)",
        group.rank,
        name,
        time.perf_counter() - start,
        user + system,
        system,
        after.ru_minflt - before.ru_minflt,
        peak_rss_bytes() / (1 << 30),
    )


def _meta(
    job: _Job,
    graph_name: str,
    out_dir: Path,
    counts: np.ndarray,
    node_specs: dict[str, FeatureSpec],
    edge_specs: dict[str, FeatureSpec],
) -> PartitionMeta:
    layout = job.layout
    parts = []
    for p in range(job.P):
        owned, halo, edges = (int(x) for x in counts[p])
        parts.append(
            PartInfo(
                dir=f"part{p}",
                num_owned_nodes=owned,
                num_halo_nodes=halo,
                num_edges=edges,
                files={name: f"part{p}/{name}.npy" for name in PART_ARRAYS},
                node_feats={key: f"part{p}/node_feat/{key}.npy" for key in node_specs},
                edge_feats={key: f"part{p}/edge_feat/{key}.npy" for key in edge_specs},
            )
        )
    extra = {"num_classes": layout.num_classes}
    if job.edge_cut is not None:
        extra["metis_edge_cut"] = int(job.edge_cut)
    return PartitionMeta(
        root=out_dir,
        graph_name=graph_name,
        num_nodes=job.N,
        num_edges=job.E,
        num_parts=job.P,
        part_method=job.opts.method,
        halo_hops=1,
        node_map=job.node_map.tolist(),
        edge_map=job.edge_map.tolist(),
        ntypes=job.ntypes,
        etypes=[etype_str(e) for e in job.etypes],
        node_type_ranges=job.node_type_ranges.tolist(),
        edge_type_ranges=job.edge_type_ranges.tolist(),
        node_feats=node_specs,
        edge_feats=edge_specs,
        orig_nid="orig_nid.npy",
        orig_eid="orig_eid.npy",
        parts=parts,
        extra=extra,
    )
