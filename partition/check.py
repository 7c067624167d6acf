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


def _check_part(meta: PartitionMeta, i: int) -> PartSummary:
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
    for name, shape in (
        ("indptr", (owned + 1,)),
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
    if not np.array_equal(arrays["eids"], np.arange(e0, e1)):
        raise _fail(meta, i, f"eids must be the partition's edge range [{e0}, {e1}) in order")
    l2g = arrays["local2global"]
    if not np.array_equal(l2g[:owned], np.arange(n0, n1)):
        raise _fail(meta, i, f"local2global must start with the owned range [{n0}, {n1})")
    halo = np.sort(l2g[owned:])
    if halo.size and (
        halo[0] < 0 or halo[-1] >= meta.num_nodes or np.any((halo >= n0) & (halo < n1)) or np.any(halo[1:] == halo[:-1])
    ):
        raise _fail(meta, i, "HALO nodes must be distinct, non-owned node ids")
    for name, spec in meta.node_feats.items():
        _check_feature(meta, i, name, load_node_feature(meta, i, name), spec, owned, "node")
    for name, spec in meta.edge_feats.items():
        _check_feature(meta, i, name, load_edge_feature(meta, i, name), spec, part.num_edges, "edge")
    train = None
    if "train_mask" in meta.node_feats:
        train = int(np.count_nonzero(load_node_feature(meta, i, "train_mask")))
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
    for name, spec in meta.node_feats.items():
        if spec.shape[:1] != (meta.num_nodes,):
            raise _fail(
                meta, None, f"node feature {name!r} has global shape {spec.shape}, expected {meta.num_nodes} rows"
            )
    for name, spec in meta.edge_feats.items():
        if spec.shape[:1] != (meta.num_edges,):
            raise _fail(
                meta, None, f"edge feature {name!r} has global shape {spec.shape}, expected {meta.num_edges} rows"
            )
    summaries = [_check_part(meta, i) for i in range(meta.num_parts)]
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
