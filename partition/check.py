"""Verify every invariant of a partition on disk and summarise it per partition.

``check_partition`` reads through the format module and raises
``PartitionFormatError`` naming the first broken invariant: contiguous
node/edge ranges covering the graph, CSC shapes and offsets, local ids in
bounds, ``local2global`` (owned prefix = the owned range, HALO nodes distinct
and not owned), ``eids`` = the partition's edge range, feature row counts,
dtypes and shapes, and ``orig_nid``/``orig_eid`` permutations.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from distgnn.errors import InputError, PartitionFormatError
from distgnn.partition.format import (
    PART_ARRAYS,
    PartitionMeta,
    feature_policy,
    load_edge_feature,
    load_node_feature,
    load_orig_ids,
    load_part_array,
    read_meta,
)


@dataclass(frozen=True)
class PartSummary:
    part_id: int
    owned_nodes: int
    halo_nodes: int
    edges: int
    cut_edges: int
    train_nodes: int | None


def _fail(meta: PartitionMeta, part_id: int | None, message: str) -> PartitionFormatError:
    where = f"{meta.json_path}" + (f" part {part_id}" if part_id is not None else "")
    return PartitionFormatError(f"{where}: {message}")


def _check_permutation(meta: PartitionMeta, ids: np.ndarray, n: int, what: str) -> None:
    if ids.shape != (n,) or ids.dtype.kind not in "iu":
        raise _fail(meta, None, f"{what} must be ({n},) integers, got {ids.dtype} {ids.shape}")
    if n and (ids.min() < 0 or ids.max() >= n or not np.all(np.bincount(ids, minlength=n) == 1)):
        raise _fail(meta, None, f"{what} is not a permutation of [0, {n})")


def _check_feature(meta: PartitionMeta, i: int, name: str, arr: np.ndarray, spec, rows: int, kind: str) -> None:
    want = (rows, *spec.shape[1:])
    if arr.shape != want or str(arr.dtype) != spec.dtype:
        raise _fail(meta, i, f"{kind} feature {name!r} is {arr.dtype} {arr.shape}, expected {spec.dtype} {want}")


def _check_typed_csc(meta, i, book, indptr, indices, eids, l2g) -> None:
    """Several edge types: ``eids`` is a permutation of the edge range, and the edges of CSC row
    ``v*R + t`` have type ``t``, destination ``v`` of type ``t``'s destination type and sources of its
    source type."""
    e0, e1 = meta.edge_map[i]
    n0 = meta.node_map[i][0]
    num_etypes = len(meta.etypes)
    if eids.size and (
        eids.min() < e0 or eids.max() >= e1 or not np.all(np.bincount(eids - e0, minlength=e1 - e0) == 1)
    ):
        raise _fail(meta, i, f"eids must be a permutation of the partition's edge range [{e0}, {e1})")
    rows = np.repeat(np.arange(len(indptr) - 1, dtype=np.int64), np.diff(indptr))
    dst_local, etype = np.divmod(rows, num_etypes)
    stored_etype, _ = book.map_to_per_etype(eids)
    if not np.array_equal(stored_etype, etype):
        raise _fail(meta, i, "an edge sits in the CSC row of another edge type than its id's")
    dst_type, _ = book.map_to_per_ntype(dst_local + n0)
    src_type, _ = book.map_to_per_ntype(l2g[indices])
    if not np.array_equal(dst_type, book.etype_dst[etype]) or not np.array_equal(src_type, book.etype_src[etype]):
        raise _fail(meta, i, "an edge's source or destination is not of its edge type's node types")


def _check_part(meta: PartitionMeta, i: int, book) -> PartSummary:
    part = meta.parts[i]
    n0, n1 = meta.node_map[i]
    e0, e1 = meta.edge_map[i]
    if part.num_owned_nodes != n1 - n0 or part.num_edges != e1 - e0:
        raise _fail(
            meta,
            i,
            f"counts {part.num_owned_nodes} nodes / {part.num_edges} edges disagree with ranges "
            f"[{n0}, {n1}) / [{e0}, {e1})",
        )
    arrays = {name: load_part_array(meta, i, name) for name in PART_ARRAYS}
    owned, num_local = part.num_owned_nodes, part.num_local_nodes
    num_etypes = len(meta.etypes)
    for name, shape in (
        ("indptr", (owned * num_etypes + 1,)),
        ("indices", (part.num_edges,)),
        ("eids", (part.num_edges,)),
        ("local2global", (num_local,)),
    ):
        arr = arrays[name]
        if arr.shape != shape or arr.dtype.kind not in "iu":
            raise _fail(meta, i, f"{name} must be {shape} integers, got {arr.dtype} {arr.shape}")
    indptr, indices = arrays["indptr"], arrays["indices"]
    if indptr[0] != 0 or indptr[-1] != part.num_edges or np.any(np.diff(indptr) < 0):
        raise _fail(meta, i, f"indptr must rise from 0 to {part.num_edges} without decreasing")
    if indices.size and (indices.min() < 0 or indices.max() >= num_local):
        raise _fail(meta, i, f"indices must be local ids in [0, {num_local})")
    eids = np.asarray(arrays["eids"])
    if num_etypes == 1 and not np.array_equal(eids, np.arange(e0, e1)):
        raise _fail(meta, i, f"eids must be the partition's edge range [{e0}, {e1}) in order")
    if num_etypes > 1:
        _check_typed_csc(meta, i, book, np.asarray(indptr), np.asarray(indices), eids, arrays["local2global"])
    l2g = arrays["local2global"]
    if not np.array_equal(l2g[:owned], np.arange(n0, n1)):
        raise _fail(meta, i, f"local2global must start with the owned range [{n0}, {n1})")
    halo = np.sort(l2g[owned:])
    if halo.size and (
        halo[0] < 0 or halo[-1] >= meta.num_nodes or np.any((halo >= n0) & (halo < n1)) or np.any(halo[1:] == halo[:-1])
    ):
        raise _fail(meta, i, "HALO nodes must be distinct, non-owned node ids")
    ranges = book.policy_ranges(i)
    train = None
    for kind, feats, loader in (
        ("node", meta.node_feats, load_node_feature),
        ("edge", meta.edge_feats, load_edge_feature),
    ):
        for key, spec in feats.items():
            policy, name = feature_policy(key, kind)
            start, end = ranges[policy]
            arr = loader(meta, i, key)
            _check_feature(meta, i, key, arr, spec, end - start, kind)
            if kind == "node" and name == "train_mask":
                train = (train or 0) + int(np.count_nonzero(arr))
    cut = int(np.count_nonzero(np.asarray(indices) >= owned))
    return PartSummary(i, owned, part.num_halo_nodes, part.num_edges, cut, train)


def check_partition(json_path: str | os.PathLike) -> tuple[PartitionMeta, list[PartSummary]]:
    """Verify the partition at ``json_path``; returns its meta and per-partition summary."""
    meta = read_meta(json_path)
    try:
        book = meta.partition_book()
    except (InputError, PartitionFormatError) as exc:
        raise _fail(meta, None, str(exc)) from exc
    if book.num_nodes != meta.num_nodes or book.num_edges != meta.num_edges:
        raise _fail(
            meta,
            None,
            f"ranges cover {book.num_nodes} nodes / {book.num_edges} edges, "
            f"expected {meta.num_nodes} / {meta.num_edges}",
        )
    totals = book.policy_totals()
    for kind, feats in (("node", meta.node_feats), ("edge", meta.edge_feats)):
        for key, spec in feats.items():
            try:
                policy, _ = feature_policy(key, kind)
                rows = totals[policy]
            except (InputError, KeyError):
                raise _fail(meta, None, f"{kind} feature {key!r} names no {kind} type of the graph") from None
            if spec.shape[:1] != (rows,):
                raise _fail(meta, None, f"{kind} feature {key!r} has global shape {spec.shape}, expected {rows} rows")
    summaries = [_check_part(meta, i, book) for i in range(meta.num_parts)]
    orig_nid, orig_eid = load_orig_ids(meta)
    _check_permutation(meta, np.asarray(orig_nid), meta.num_nodes, "orig_nid")
    _check_permutation(meta, np.asarray(orig_eid), meta.num_edges, "orig_eid")
    return meta, summaries


def format_summary(meta: PartitionMeta, rows: list[PartSummary]) -> str:
    """A plain-text table: one line per partition plus a total line."""
    header = ("part", "owned nodes", "halo nodes", "edges", "cut edges", "train nodes")

    def cells(r: PartSummary | None) -> tuple[str, ...]:
        if r is None:
            train = [x.train_nodes for x in rows]
            values = ("total", sum(x.owned_nodes for x in rows), sum(x.halo_nodes for x in rows))
            values += (sum(x.edges for x in rows), sum(x.cut_edges for x in rows))
            values += (sum(train) if None not in train else None,)
        else:
            values = (r.part_id, r.owned_nodes, r.halo_nodes, r.edges, r.cut_edges, r.train_nodes)
        return tuple("-" if v is None else f"{v:,}" if isinstance(v, int) else str(v) for v in values)

    table = [header, *(cells(r) for r in rows), cells(None)]
    widths = [max(len(row[c]) for row in table) for c in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    total_cut = sum(r.cut_edges for r in rows)
    title = (
        f"{meta.graph_name}: {meta.num_nodes:,} nodes, {meta.num_edges:,} edges, {meta.num_parts} parts "
        f"({meta.part_method}, halo_hops={meta.halo_hops}), edge cut {total_cut:,} "
        f"({100.0 * total_cut / max(meta.num_edges, 1):.1f}% of edges)"
    )
    return "\n".join([title, *lines])
