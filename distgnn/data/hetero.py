"""The in-memory heterogeneous graph that readers and generators produce and the partitioner consumes.

A :class:`HeteroGraph` holds per-type node counts, per canonical edge type ``(src_type, relation,
dst_type)`` the edge list in per-type ids, and per-type node and edge arrays. Large arrays need not be in
memory: a :class:`ChunkedArray` names its chunks and loads one at a time (the chunked-format reader hands
features over this way, so the partitioner streams them instead of holding every chunk at once).

A homogeneous :class:`~distgnn.data.graph.Graph` is the one-type case (:meth:`HeteroGraph.from_homogeneous`,
node type ``"_N"``, edge type ``("_N", "_E", "_N")``), so one partitioner serves both.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from distgnn.data.graph import Graph
from distgnn.errors import InputError

CanonicalEtype = tuple[str, str, str]

DEFAULT_NTYPE = "_N"
DEFAULT_ETYPE: CanonicalEtype = ("_N", "_E", "_N")

# Type names become parts of file and shared-memory names (see the partition format).
_TYPE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_\-]{0,63}$")


def check_type_name(name: object, what: str) -> str:
    """A node type or relation name: letters, digits, ``_`` and ``-`` (not first), at most 64 characters."""
    if not isinstance(name, str) or not _TYPE_NAME.match(name):
        raise InputError(f"{what} {name!r} must be letters, digits, '_' or '-' (not starting with '-'), at most 64")
    return name


def etype_str(etype: CanonicalEtype) -> str:
    """``"src:rel:dst"``: how a canonical edge type is written in the partition JSON and DGL's metadata."""
    return ":".join(etype)


def parse_etype(text: str) -> CanonicalEtype:
    """The inverse of :func:`etype_str`; raises InputError unless ``text`` is ``"src:rel:dst"``."""
    parts = text.split(":") if isinstance(text, str) else []
    if len(parts) != 3:
        raise InputError(f"edge type {text!r} must be 'src_type:relation:dst_type'")
    return (parts[0], parts[1], parts[2])


class ChunkedArray:
    """A node or edge array kept as consecutive chunks that are loaded one at a time.

    Args:
        chunks: per chunk, ``(rows, load)``: its row count and a function returning the chunk as an array
            of ``rows`` rows (the loader checks it; a mismatch raises InputError naming ``where``).
        dtype: the array's dtype (every chunk must have it).
        row_shape: the shape of one row (``()`` for a 1-D array).
        where: how errors name this array (e.g. the metadata entry and file).
    """

    def __init__(
        self,
        chunks: list[tuple[int, Callable[[], np.ndarray]]],
        dtype: np.dtype | str,
        row_shape: tuple[int, ...],
        where: str,
    ):
        self.chunks = list(chunks)
        self.dtype = np.dtype(dtype)
        self.row_shape = tuple(int(d) for d in row_shape)
        self.where = where

    @property
    def shape(self) -> tuple[int, ...]:
        return (sum(rows for rows, _ in self.chunks), *self.row_shape)

    @property
    def ndim(self) -> int:
        return 1 + len(self.row_shape)

    def __len__(self) -> int:
        return self.shape[0]

    def iter_chunks(self) -> Iterator[tuple[int, np.ndarray]]:
        """``(first row, chunk)`` for every chunk in order; only one chunk is loaded at a time."""
        start = 0
        for index, (rows, load) in enumerate(self.chunks):
            chunk = np.asarray(load())
            if chunk.shape != (rows, *self.row_shape) or chunk.dtype != self.dtype:
                raise InputError(
                    f"{self.where}: chunk {index} is {chunk.dtype}{list(chunk.shape)}, expected "
                    f"{self.dtype}{[rows, *self.row_shape]}"
                )
            yield start, chunk
            start += rows

    def read(self) -> np.ndarray:
        """The whole array in memory (small graphs and tests)."""
        out = np.empty(self.shape, dtype=self.dtype)
        for start, chunk in self.iter_chunks():
            out[start : start + len(chunk)] = chunk
        return out


FeatureArray = np.ndarray | ChunkedArray


def iter_row_blocks(array: FeatureArray, block_rows: int = 1 << 20) -> Iterator[tuple[int, np.ndarray]]:
    """``(first row, rows)`` blocks of an in-memory or chunked array, at most one chunk in memory at a time."""
    if isinstance(array, ChunkedArray):
        yield from array.iter_chunks()
        return
    for start in range(0, len(array), block_rows):
        yield start, array[start : start + block_rows]


def materialize(array: FeatureArray) -> np.ndarray:
    """The whole array as a numpy array."""
    return array.read() if isinstance(array, ChunkedArray) else np.asarray(array)


@dataclass
class HeteroGraph:
    """A heterogeneous directed graph.

    Attributes:
        name: graph name (the default partition name).
        num_nodes: node count per node type; the key order fixes the node type ids.
        edges: per canonical edge type ``(src_type, relation, dst_type)``, ``(src, dst)``: ``(E_t,)`` int64
            per-type node ids (edge ``k`` of type ``t`` goes ``src[k] -> dst[k]``); the key order fixes the
            edge type ids.
        ndata: per node type, arrays whose first dimension is that type's node count (conventional names as
            in :class:`~distgnn.data.graph.Graph`: ``feat``, ``label``, ``train_mask``...).
        edata: per canonical edge type, arrays whose first dimension is that type's edge count.
        num_classes: label count of the labelled node type, where there is one.
    """

    name: str
    num_nodes: dict[str, int]
    edges: dict[CanonicalEtype, tuple[np.ndarray, np.ndarray]]
    ndata: dict[str, dict[str, FeatureArray]] = field(default_factory=dict)
    edata: dict[CanonicalEtype, dict[str, FeatureArray]] = field(default_factory=dict)
    num_classes: int | None = None

    @property
    def ntypes(self) -> list[str]:
        return list(self.num_nodes)

    @property
    def canonical_etypes(self) -> list[CanonicalEtype]:
        return list(self.edges)

    @property
    def is_homogeneous(self) -> bool:
        return self.ntypes == [DEFAULT_NTYPE] and self.canonical_etypes == [DEFAULT_ETYPE]

    def num_edges(self, etype: CanonicalEtype | None = None) -> int:
        if etype is None:
            return sum(int(src.shape[0]) for src, _ in self.edges.values())
        return int(self.edges[etype][0].shape[0])

    @property
    def total_nodes(self) -> int:
        return sum(self.num_nodes.values())

    @classmethod
    def from_homogeneous(cls, graph: Graph) -> HeteroGraph:
        """``graph`` as the one-type case (its arrays are shared, not copied)."""
        return cls(
            name=graph.name,
            num_nodes={DEFAULT_NTYPE: graph.num_nodes},
            edges={DEFAULT_ETYPE: (graph.src, graph.dst)},
            ndata={DEFAULT_NTYPE: dict(graph.ndata)},
            edata={DEFAULT_ETYPE: dict(graph.edata)},
            num_classes=graph.num_classes,
        )

    def node_offsets(self) -> dict[str, int]:
        """Per node type, the homogeneous id of its first node when types are laid out in order."""
        offsets, total = {}, 0
        for ntype, count in self.num_nodes.items():
            offsets[ntype] = total
            total += int(count)
        return offsets

    def validate(self) -> HeteroGraph:
        """Check names, shapes, dtypes and id ranges; raises InputError naming the first problem."""
        for ntype, count in self.num_nodes.items():
            check_type_name(ntype, "node type")
            if int(count) < 0:
                raise InputError(f"node type {ntype!r} has a negative node count {count}")
        for etype, (src, dst) in self.edges.items():
            if not (isinstance(etype, tuple) and len(etype) == 3):
                raise InputError(f"edge type {etype!r} must be a canonical (src_type, relation, dst_type) triple")
            check_type_name(etype[1], "relation")
            for end, ntype in (("source", etype[0]), ("destination", etype[2])):
                if ntype not in self.num_nodes:
                    raise InputError(
                        f"edge type {etype_str(etype)!r} names {end} node type {ntype!r}, which is not one of "
                        f"the node types {self.ntypes}"
                    )
            for what, ids, ntype in (("src", src, etype[0]), ("dst", dst, etype[2])):
                if ids.ndim != 1 or ids.dtype.kind not in "iu":
                    raise InputError(f"edge type {etype_str(etype)!r}: {what} must be a 1-d integer array")
                bound = int(self.num_nodes[ntype])
                if ids.size and (ids.min() < 0 or ids.max() >= bound):
                    bad = ids[(ids < 0) | (ids >= bound)][0]
                    raise InputError(
                        f"edge type {etype_str(etype)!r}: {what} id {int(bad)} is out of range for node type "
                        f"{ntype!r} ([0, {bound}))"
                    )
            if src.shape != dst.shape:
                raise InputError(f"edge type {etype_str(etype)!r}: {len(src)} sources but {len(dst)} destinations")
        for ntype, arrays in self.ndata.items():
            if ntype not in self.num_nodes:
                raise InputError(f"node data for unknown node type {ntype!r} (node types: {self.ntypes})")
            for name, array in arrays.items():
                if array.shape[:1] != (int(self.num_nodes[ntype]),):
                    raise InputError(
                        f"node data {name!r} of type {ntype!r} has {array.shape[0] if array.ndim else 0} rows, "
                        f"expected {self.num_nodes[ntype]}"
                    )
        for etype, arrays in self.edata.items():
            if etype not in self.edges:
                raise InputError(f"edge data for unknown edge type {etype!r}")
            for name, array in arrays.items():
                if array.shape[:1] != (self.num_edges(etype),):
                    raise InputError(
                        f"edge data {name!r} of type {etype_str(etype)!r} has {array.shape[0] if array.ndim else 0} "
                        f"rows, expected {self.num_edges(etype)}"
                    )
        return self
