"""Range partition book: which partition owns a node or edge id, and typed ids <-> homogeneous ids.

After reshuffling, partition ``i`` owns the contiguous homogeneous node ids ``node_map[i] = [start, end)``
and edge ids ``edge_map[i]``; inside it every node type (edge type) owns a contiguous sub-range, types in
order (see docs/partition-format.md). So per-type ids, which number the nodes of one type partition by
partition, are contiguous per partition too. Every lookup is a vectorised binary search over range ends;
ids may be numpy arrays or torch tensors and results have the same kind.

Ids come in *id spaces*, named by a policy string: ``"node"`` and ``"edge"`` are the homogeneous spaces;
``"node:<ntype>"`` and ``"edge:<src>:<rel>:<dst>"`` the per-type spaces of a heterogeneous graph. The
default types of a homogeneous graph (``_N``, ``_N:_E:_N``) are the homogeneous spaces themselves, so their
policy is plain ``"node"`` / ``"edge"``. A DistTensor lives in one id space.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from distgnn.data.hetero import DEFAULT_ETYPE, DEFAULT_NTYPE, CanonicalEtype, etype_str, parse_etype
from distgnn.errors import InputError, PartitionFormatError

POLICY_KINDS = ("node", "edge")


def node_policy(ntype: str) -> str:
    """The id space (DistTensor ``part_policy``) of node type ``ntype``'s per-type ids."""
    return "node" if ntype == DEFAULT_NTYPE else f"node:{ntype}"


def edge_policy(etype: CanonicalEtype) -> str:
    """The id space of canonical edge type ``etype``'s per-type ids."""
    return "edge" if tuple(etype) == DEFAULT_ETYPE else f"edge:{etype_str(etype)}"


def _to_numpy(ids: Any) -> tuple[np.ndarray, bool]:
    """Return ``(int64 array, was_torch)`` without copying where possible."""
    if type(ids).__module__.startswith("torch"):
        return ids.detach().cpu().numpy().astype(np.int64, copy=False), True
    arr = np.asarray(ids)
    if arr.dtype.kind not in "iu" and arr.size:
        raise InputError(f"ids must be integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False), False


def _like(result: np.ndarray, was_torch: bool) -> Any:
    if was_torch:
        import torch

        return torch.from_numpy(np.ascontiguousarray(result))
    return result


class TypedRanges:
    """One kind of id (nodes or edges): partition ranges and, inside them, per-type ranges.

    Args:
        part_ranges: ``(P, 2)`` homogeneous ``[start, end)`` per partition.
        type_names: the types, in type-id order.
        type_ranges: ``(P, T, 2)`` homogeneous ``[start, end)`` per (partition, type); None for one type
            (then it equals ``part_ranges``).
        kind: ``"node"`` or ``"edge"`` (for messages).
    """

    def __init__(self, part_ranges: np.ndarray, type_names: Sequence[str], type_ranges: np.ndarray | None, kind: str):
        self.kind = kind
        self.part_ranges = np.asarray(part_ranges, dtype=np.int64).reshape(-1, 2)
        _check_contiguous(self.part_ranges, f"{kind}_map")
        self.type_names = list(type_names)
        num_parts, num_types = len(self.part_ranges), len(self.type_names)
        if num_types < 1:
            raise PartitionFormatError(f"a graph needs at least one {kind} type")
        if type_ranges is None:
            if num_types != 1:
                raise PartitionFormatError(f"{num_types} {kind} types need per-type ranges")
            type_ranges = self.part_ranges[:, None, :]
        self.type_ranges = np.asarray(type_ranges, dtype=np.int64).reshape(num_parts, num_types, 2)
        flat = self.type_ranges.reshape(-1, 2)
        _check_contiguous(flat, f"{kind} type ranges")
        if not (
            np.array_equal(self.type_ranges[:, 0, 0], self.part_ranges[:, 0])
            and np.array_equal(self.type_ranges[:, -1, 1], self.part_ranges[:, 1])
        ):
            raise PartitionFormatError(f"{kind} type ranges do not tile each partition's {kind} range")
        self.flat_ends = np.ascontiguousarray(flat[:, 1])
        self.flat_starts = np.ascontiguousarray(flat[:, 0])
        sizes = self.type_ranges[:, :, 1] - self.type_ranges[:, :, 0]  # (P, T)
        # Per-type id of the first id of each (partition, type) range, and the end of each partition's
        # per-type range (T, P), for per-type id -> owner.
        self.type_offsets = np.cumsum(sizes, axis=0) - sizes
        self.per_type_ends = np.ascontiguousarray(np.cumsum(sizes, axis=0).T)
        self.type_counts = sizes.sum(axis=0)
        self._index = {name: t for t, name in enumerate(self.type_names)}

    @property
    def num_parts(self) -> int:
        return len(self.part_ranges)

    @property
    def num_types(self) -> int:
        return len(self.type_names)

    @property
    def total(self) -> int:
        return int(self.part_ranges[-1, 1])

    def type_id(self, name: str) -> int:
        try:
            return self._index[name]
        except KeyError:
            raise InputError(f"unknown {self.kind} type {name!r}; the graph has {self.type_names}") from None

    def _check_ids(self, arr: np.ndarray, bound: int, what: str) -> None:
        if arr.size and (arr.min() < 0 or arr.max() >= bound):
            bad = arr[(arr < 0) | (arr >= bound)][0]
            raise InputError(f"{what} id {int(bad)} is out of range [0, {bound})")

    def owner(self, ids: np.ndarray) -> np.ndarray:
        """Partition of each homogeneous id (checked)."""
        self._check_ids(ids, self.total, self.kind)
        return np.searchsorted(self.part_ranges[:, 1], ids, side="right")

    def locate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(owner, type id, per-type id)`` of each homogeneous id (checked), from one binary search."""
        self._check_ids(ids, self.total, self.kind)
        flat = np.searchsorted(self.flat_ends, ids, side="right")
        owner, type_ids = np.divmod(flat, self.num_types)
        per_type = ids - self.flat_starts[flat] + self.type_offsets.reshape(-1)[flat]
        return owner, type_ids, per_type

    def to_homogeneous(self, type_id: int, per_type_ids: np.ndarray) -> np.ndarray:
        """Homogeneous ids of per-type ids of type ``type_id`` (checked)."""
        self._check_ids(per_type_ids, int(self.type_counts[type_id]), f"{self.kind} {self.type_names[type_id]!r}")
        owner = np.searchsorted(self.per_type_ends[type_id], per_type_ids, side="right")
        return per_type_ids - self.type_offsets[owner, type_id] + self.type_ranges[owner, type_id, 0]

    def per_type_owner(self, type_id: int, per_type_ids: np.ndarray) -> np.ndarray:
        self._check_ids(per_type_ids, int(self.type_counts[type_id]), f"{self.kind} {self.type_names[type_id]!r}")
        return np.searchsorted(self.per_type_ends[type_id], per_type_ids, side="right")

    def per_type_range(self, type_id: int, part: int) -> tuple[int, int]:
        start = int(self.type_offsets[part, type_id])
        size = int(self.type_ranges[part, type_id, 1] - self.type_ranges[part, type_id, 0])
        return start, start + size


def _check_contiguous(ranges: np.ndarray, what: str) -> None:
    if ranges.ndim != 2 or ranges.shape[1] != 2 or len(ranges) == 0:
        raise PartitionFormatError(f"{what} must be a non-empty list of [start, end) pairs, got shape {ranges.shape}")
    if ranges[0, 0] != 0 or np.any(ranges[1:, 0] != ranges[:-1, 1]) or np.any(ranges[:, 1] < ranges[:, 0]):
        raise PartitionFormatError(
            f"{what} ranges must start at 0 and be contiguous and non-decreasing, got {ranges.tolist()}"
        )


class RangePartitionBook:
    """Maps ids to partitions, and homogeneous ids to (type, per-type id) and back.

    Args:
        node_map, edge_map: ``(P, 2)`` homogeneous ``[start, end)`` per partition.
        ntypes: node type names in type-id order (default: the one type ``_N``).
        etypes: canonical edge types in type-id order (default: ``("_N", "_E", "_N")``).
        node_type_ranges: ``(P, T, 2)`` homogeneous ranges per (partition, node type); None for one type.
        edge_type_ranges: ``(P, R, 2)`` likewise for edge types.
    """

    def __init__(
        self,
        node_map: Sequence[Sequence[int]] | np.ndarray,
        edge_map: Sequence[Sequence[int]] | np.ndarray,
        ntypes: Sequence[str] = (DEFAULT_NTYPE,),
        etypes: Sequence[CanonicalEtype] = (DEFAULT_ETYPE,),
        node_type_ranges: np.ndarray | None = None,
        edge_type_ranges: np.ndarray | None = None,
    ):
        self.nodes = TypedRanges(np.asarray(node_map).reshape(-1, 2), list(ntypes), node_type_ranges, "node")
        self.canonical_etypes = [tuple(e) for e in etypes]
        names = [etype_str(e) for e in self.canonical_etypes]
        self.edges = TypedRanges(np.asarray(edge_map).reshape(-1, 2), names, edge_type_ranges, "edge")
        if self.nodes.num_parts != self.edges.num_parts:
            raise PartitionFormatError(
                f"node_map has {self.nodes.num_parts} partitions but edge_map has {self.edges.num_parts}"
            )
        for src, _, dst in self.canonical_etypes:
            for t in (src, dst):
                if t not in self.nodes.type_names:
                    raise PartitionFormatError(f"edge type {src}:{_}:{dst} names unknown node type {t!r}")
        self.node_map = self.nodes.part_ranges
        self.edge_map = self.edges.part_ranges
        # Node type id of each edge type's destination and source.
        self.etype_dst = np.array([self.nodes.type_id(d) for _, _, d in self.canonical_etypes], dtype=np.int64)
        self.etype_src = np.array([self.nodes.type_id(s) for s, _, _ in self.canonical_etypes], dtype=np.int64)

    @property
    def ntypes(self) -> list[str]:
        return list(self.nodes.type_names)

    @property
    def etypes(self) -> list[str]:
        """Relation names (the middle of each canonical edge type)."""
        return [r for _, r, _ in self.canonical_etypes]

    @property
    def is_homogeneous(self) -> bool:
        return self.ntypes == [DEFAULT_NTYPE] and self.canonical_etypes == [DEFAULT_ETYPE]

    @property
    def num_partitions(self) -> int:
        return self.nodes.num_parts

    @property
    def num_nodes(self) -> int:
        return self.nodes.total

    @property
    def num_edges(self) -> int:
        return self.edges.total

    def to_canonical_etype(self, etype: str | CanonicalEtype) -> CanonicalEtype:
        """``(src, rel, dst)`` of an edge type given as a tuple, ``"src:rel:dst"`` or an unambiguous relation name."""
        if isinstance(etype, tuple):
            if etype in self.canonical_etypes:
                return etype
            raise InputError(f"unknown edge type {etype}; the graph has {self.canonical_etypes}")
        if ":" in etype:
            return self.to_canonical_etype(parse_etype(etype))
        found = [c for c in self.canonical_etypes if c[1] == etype]
        if len(found) != 1:
            what = "unknown" if not found else "ambiguous"
            raise InputError(f"{what} edge type {etype!r}; use one of {self.canonical_etypes}")
        return found[0]

    def etype_id(self, etype: str | CanonicalEtype) -> int:
        return self.edges.type_id(etype_str(self.to_canonical_etype(etype)))

    def ntype_id(self, ntype: str) -> int:
        return self.nodes.type_id(ntype)

    # --- owners -------------------------------------------------------------------------------------

    def nid2partid(self, nids: Any, ntype: str | None = None) -> Any:
        """Partition of each node id: homogeneous ids, or per-type ids of ``ntype``."""
        arr, was_torch = _to_numpy(nids)
        if ntype is None:
            return _like(self.nodes.owner(arr), was_torch)
        return _like(self.nodes.per_type_owner(self.ntype_id(ntype), arr), was_torch)

    def eid2partid(self, eids: Any, etype: str | CanonicalEtype | None = None) -> Any:
        """Partition of each edge id: homogeneous ids, or per-type ids of ``etype``."""
        arr, was_torch = _to_numpy(eids)
        if etype is None:
            return _like(self.edges.owner(arr), was_torch)
        return _like(self.edges.per_type_owner(self.etype_id(etype), arr), was_torch)

    # --- typed <-> homogeneous ------------------------------------------------------------------------

    def map_to_per_ntype(self, nids: Any) -> tuple[Any, Any]:
        """``(node type ids, per-type ids)`` of homogeneous node ids."""
        arr, was_torch = _to_numpy(nids)
        _, types, per_type = self.nodes.locate(arr)
        return _like(types, was_torch), _like(per_type, was_torch)

    def map_to_per_etype(self, eids: Any) -> tuple[Any, Any]:
        """``(edge type ids, per-type ids)`` of homogeneous edge ids."""
        arr, was_torch = _to_numpy(eids)
        _, types, per_type = self.edges.locate(arr)
        return _like(types, was_torch), _like(per_type, was_torch)

    def map_to_homo_nid(self, ids: Any, ntype: str) -> Any:
        """Homogeneous ids of per-type ids of ``ntype``."""
        arr, was_torch = _to_numpy(ids)
        return _like(self.nodes.to_homogeneous(self.ntype_id(ntype), arr), was_torch)

    def map_to_homo_eid(self, ids: Any, etype: str | CanonicalEtype) -> Any:
        """Homogeneous ids of per-type ids of ``etype``."""
        arr, was_torch = _to_numpy(ids)
        return _like(self.edges.to_homogeneous(self.etype_id(etype), arr), was_torch)

    # --- per partition --------------------------------------------------------------------------------

    def _check_part(self, partid: int) -> None:
        if not 0 <= partid < self.num_partitions:
            raise InputError(f"partition id {partid} is out of range [0, {self.num_partitions})")

    def node_range(self, partid: int) -> tuple[int, int]:
        """Homogeneous node ids ``[start, end)`` owned by ``partid``."""
        self._check_part(partid)
        start, end = self.node_map[partid]
        return int(start), int(end)

    def edge_range(self, partid: int) -> tuple[int, int]:
        self._check_part(partid)
        start, end = self.edge_map[partid]
        return int(start), int(end)

    def partid2nids(self, partid: int, ntype: str | None = None) -> np.ndarray:
        """Node ids owned by ``partid``: homogeneous, or per-type ids of ``ntype``."""
        if ntype is None:
            return np.arange(*self.node_range(partid), dtype=np.int64)
        self._check_part(partid)
        return np.arange(*self.nodes.per_type_range(self.ntype_id(ntype), partid), dtype=np.int64)

    def partid2eids(self, partid: int, etype: str | CanonicalEtype | None = None) -> np.ndarray:
        """Edge ids owned by ``partid``: homogeneous, or per-type ids of ``etype``."""
        if etype is None:
            return np.arange(*self.edge_range(partid), dtype=np.int64)
        self._check_part(partid)
        return np.arange(*self.edges.per_type_range(self.etype_id(etype), partid), dtype=np.int64)

    def policy_ranges(self, partid: int) -> dict[str, tuple[int, int]]:
        """``{policy: [start, end)}`` of every id space (see :func:`node_policy`) owned by ``partid``."""
        self._check_part(partid)
        ranges = {"node": self.node_range(partid), "edge": self.edge_range(partid)}
        if not self.is_homogeneous:
            for t, ntype in enumerate(self.ntypes):
                ranges[node_policy(ntype)] = self.nodes.per_type_range(t, partid)
            for t, etype in enumerate(self.canonical_etypes):
                ranges[edge_policy(etype)] = self.edges.per_type_range(t, partid)
        return ranges

    def policy_totals(self) -> dict[str, int]:
        """``{policy: number of ids}`` of every id space."""
        totals = {"node": self.num_nodes, "edge": self.num_edges}
        if not self.is_homogeneous:
            for t, ntype in enumerate(self.ntypes):
                totals[node_policy(ntype)] = int(self.nodes.type_counts[t])
            for t, etype in enumerate(self.canonical_etypes):
                totals[edge_policy(etype)] = int(self.edges.type_counts[t])
        return totals

    def _to_local(self, ids: Any, start_end: tuple[int, int], what: str, partid: int) -> Any:
        arr, was_torch = _to_numpy(ids)
        start, end = start_end
        if arr.size and (arr.min() < start or arr.max() >= end):
            bad = arr[(arr < start) | (arr >= end)][0]
            raise InputError(f"{what} id {int(bad)} is not owned by partition {partid} (owns [{start}, {end}))")
        return _like(arr - start, was_torch)

    def nid2localnid(self, nids: Any, partid: int) -> Any:
        """Offsets of owned homogeneous node ids within ``partid``'s range."""
        return self._to_local(nids, self.node_range(partid), "node", partid)

    def eid2localeid(self, eids: Any, partid: int) -> Any:
        """Offsets of owned homogeneous edge ids within ``partid``'s range."""
        return self._to_local(eids, self.edge_range(partid), "edge", partid)
