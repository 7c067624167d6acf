"""``partition_graph``: assign, reshuffle and write a graph in the on-disk format.

Phases (each logged with its time): METIS or random assignment, reshuffle
(new ids and the global CSC), write (per-partition arrays and features through
``PartitionWriter``, which stages beside the output and renames into place).

A heterogeneous graph goes through the same phases on its homogeneous view
(node types one after the other, edge types concatenated). Its features are
streamed: each chunk of a :class:`~distgnn.data.hetero.ChunkedArray` is read
once and its rows are scattered into every partition's memory-mapped output,
so peak memory holds the id arrays and one chunk, never a whole feature.
"""

from __future__ import annotations

import logging
import os
import re
import resource
import sys
import time
from pathlib import Path

import numpy as np

from distgnn.data.graph import Graph
from distgnn.data.hetero import (
    DEFAULT_ETYPE,
    DEFAULT_NTYPE,
    ChunkedArray,
    FeatureArray,
    HeteroGraph,
    etype_str,
    iter_row_blocks,
)
from distgnn.errors import InputError
from distgnn.partition.assign import METHODS, metis_assignment, random_assignment, range_assignment
from distgnn.partition.format import (
    PART_ARRAYS,
    FeatureSpec,
    PartInfo,
    PartitionMeta,
    PartitionWriter,
    check_output_dir,
    feature_key,
)
from distgnn.partition.reshuffle import Reshuffled, edge_type_ranges, local_partition, reshuffle, reshuffle_typed

logger = logging.getLogger(__name__)

# Graph and feature names become file names.
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def _check_name(name: str, what: str) -> None:
    if not _NAME.match(name):
        raise InputError(f"{what} {name!r} must be letters, digits, '_', '.', '-' (not starting with '.' or '-')")


def _check_args(graph: HeteroGraph, num_parts: int, graph_name: str, method: str, halo_hops: int) -> None:
    _check_name(graph_name, "graph name")
    for arrays in (*graph.ndata.values(), *graph.edata.values()):
        for name in arrays:
            _check_name(name, "feature name")
    if method not in METHODS:
        raise InputError(f"unknown partition method {method!r}; expected one of {', '.join(METHODS)}")
    if not 1 <= num_parts <= max(graph.total_nodes, 1):
        raise InputError(f"num_parts must be between 1 and the node count {graph.total_nodes}, got {num_parts}")
    if halo_hops < 1:
        raise InputError(f"halo_hops must be >= 1 (HALO nodes hold the sources of cut edges), got {halo_hops}")
    if halo_hops > 1 and len(graph.edges) > 1:
        raise InputError(f"halo_hops > 1 needs a graph with one edge type; this one has {len(graph.edges)}")


def _peak_rss_gib() -> float:
    """Peak resident memory of this process so far (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 30) if sys.platform == "darwin" else peak / (1 << 20)


class _Phase:
    """Logs how long a phase took and the peak RSS so far."""

    def __init__(self, name: str):
        self.name = name

    def __enter__(self) -> _Phase:
        self.start = time.perf_counter()
        logger.info("%s ...", self.name)
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            logger.info(
                "%s done in %.1f s (peak RSS so far %.2f GiB)",
                self.name,
                time.perf_counter() - self.start,
                _peak_rss_gib(),
            )


def partition_graph(
    graph: Graph | HeteroGraph,
    num_parts: int,
    out_dir: str | os.PathLike,
    graph_name: str | None = None,
    method: str = "metis",
    balance_train: bool = False,
    balance_edges: bool = False,
    target_ntype: str | None = None,
    halo_hops: int = 1,
    seed: int = 0,
    overwrite: bool = False,
    metis_coarsen: str = "auto",
) -> Path:
    """Partition ``graph`` into ``num_parts`` and write it under ``out_dir``.

    Args:
        graph: the input, homogeneous or heterogeneous; every node/edge array becomes a feature.
        num_parts: K, between 1 and the node count.
        out_dir: output directory; must be absent, empty, or (with ``overwrite``)
            hold a partition of the same graph name.
        graph_name: defaults to ``graph.name``; names the JSON file.
        method: ``"metis"``, ``"random"`` (a seeded permutation of the ids dealt round robin, computable
            per id: ``assign.random_assignment``) or ``"range"`` (each node type's ids in consecutive ranges).
        balance_train: METIS balances train nodes (``train_mask`` of ``target_ntype``) per part.
        balance_edges: METIS balances in-edges per part.
        target_ntype: the labelled node type of a heterogeneous graph (for ``balance_train``);
            defaults to the one node type with a ``train_mask``. METIS always balances node types.
        halo_hops: HALO nodes are the non-owned nodes within this many in-hops (> 1: one edge type only).
        seed: METIS / random seed.
        metis_coarsen: ``"auto"`` (large graphs are clustered and contracted in numpy
            before METIS, which needs a fraction of METIS's memory), ``"on"`` or
            ``"off"`` (the whole graph to METIS); see ``distgnn.partition.coarsen``.

    Returns:
        Path of the written ``<graph_name>.json``.
    """
    if isinstance(graph, Graph):
        graph.validate()
        graph = HeteroGraph.from_homogeneous(graph)
    graph.validate()
    graph_name = graph_name or graph.name
    _check_args(graph, num_parts, graph_name, method, halo_hops)
    out_dir = Path(out_dir).resolve()
    check_output_dir(out_dir, graph_name, overwrite)
    n = graph.total_nodes
    num_etypes = len(graph.edges)
    with _Phase("homogeneous view"):
        src, dst, etype = _homogeneous_edges(graph)
    edge_cut = None
    with _Phase(f"{method} partition into {num_parts}"):
        if method == "metis":
            groups = _balance_groups(graph, balance_train, target_ntype)
            part, edge_cut = metis_assignment(
                n, src, dst, num_parts, groups, balance_edges, seed, coarsen=metis_coarsen
            )
            del groups
        elif method == "range":
            part = range_assignment([graph.num_nodes[t] for t in graph.ntypes], num_parts)
        else:
            part = random_assignment(n, num_parts, seed)
    with _Phase("reshuffle"):
        if etype is None:
            shuffled = reshuffle(n, src, dst, part, num_parts)
        else:
            shuffled = reshuffle_typed(n, src, dst, etype, num_etypes, part, num_parts)
    del part, src, dst, etype
    with _Phase("write"):
        json_path = _write(graph, graph_name, method, halo_hops, shuffled, out_dir, overwrite, edge_cut)
    logger.info("wrote %s", json_path)
    return json_path


def _homogeneous_edges(graph: HeteroGraph) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(src, dst, etype)`` in homogeneous ids; ``etype`` None for one edge type (arrays shared, not copied)."""
    if len(graph.edges) == 1 and graph.ntypes == [DEFAULT_NTYPE]:
        ((s, d),) = graph.edges.values()
        return s.astype(np.int64, copy=False), d.astype(np.int64, copy=False), None
    offsets = graph.node_offsets()
    total = graph.num_edges()
    src = np.empty(total, dtype=np.int64)
    dst = np.empty(total, dtype=np.int64)
    etype = np.empty(total, dtype=np.int64)
    at = 0
    for t, ((s_type, _, d_type), (s, d)) in enumerate(graph.edges.items()):
        k = s.shape[0]
        np.add(s, offsets[s_type], out=src[at : at + k], casting="unsafe")
        np.add(d, offsets[d_type], out=dst[at : at + k], casting="unsafe")
        etype[at : at + k] = t
        at += k
    return src, dst, (etype if len(graph.edges) > 1 else None)


def _balance_groups(graph: HeteroGraph, balance_train: bool, target_ntype: str | None) -> np.ndarray | None:
    """``(N,)`` group per node for METIS's balance constraints (see ``metis_assignment``), or None."""
    ntypes = graph.ntypes
    if balance_train:
        if target_ntype is None:
            labelled = [t for t in ntypes if "train_mask" in graph.ndata.get(t, {})]
            if len(labelled) != 1:
                raise InputError(
                    f"balance_train needs a node array 'train_mask' of one node type; found it on {labelled}: "
                    "name the type with target_ntype"
                )
            target_ntype = labelled[0]
        if "train_mask" not in graph.ndata.get(target_ntype, {}):
            raise InputError(f"balance_train needs a node array 'train_mask' of type {target_ntype!r}; it has none")
    if len(ntypes) == 1 and not balance_train:
        return None
    groups = np.empty(graph.total_nodes, dtype=np.int64)
    offsets = graph.node_offsets()
    for t, ntype in enumerate(ntypes):
        groups[offsets[ntype] : offsets[ntype] + graph.num_nodes[ntype]] = t
    if balance_train:
        first = offsets[target_ntype]
        for start, block in iter_row_blocks(graph.ndata[target_ntype]["train_mask"]):
            view = groups[first + start : first + start + len(block)]
            view[np.asarray(block).astype(bool, copy=False)] = len(ntypes)
    return groups


def _type_ranges(sizes: np.ndarray) -> np.ndarray:
    """``(P, T, 2)`` consecutive ranges of ``(P, T)`` sizes, partition-major."""
    ends = np.cumsum(sizes.reshape(-1), dtype=np.int64)
    return np.stack([ends - sizes.reshape(-1), ends], axis=1).reshape(*sizes.shape, 2)


def _scatter_feature(
    writer: PartitionWriter, array: FeatureArray, rel: str, new_pos: np.ndarray, part_starts: np.ndarray
) -> list[str]:
    """Write ``array``'s rows into per-partition files ``part<i>/<rel>.npy`` in new per-type order.

    ``new_pos``: ``(count,)`` new per-type position of each original row; ``part_starts``: ``(P+1,)``
    first per-type position of each partition. Rows are read one block (chunk) at a time.
    """
    num_parts = len(part_starts) - 1
    row_shape = tuple(array.shape[1:])
    if isinstance(array, np.ndarray):
        order = np.empty_like(new_pos)
        order[new_pos] = np.arange(len(new_pos), dtype=np.int64)
        return [
            writer.save(f"part{i}/{rel}.npy", array[order[part_starts[i] : part_starts[i + 1]]])
            for i in range(num_parts)
        ]
    outs = [
        writer.open(f"part{i}/{rel}.npy", array.dtype, (int(part_starts[i + 1] - part_starts[i]), *row_shape))
        for i in range(num_parts)
    ]
    for start, block in iter_row_blocks(array):
        target = new_pos[start : start + len(block)]
        owner = np.searchsorted(part_starts[1:], target, side="right")
        for i in np.unique(owner).tolist():
            rows = owner == i
            outs[i][target[rows] - part_starts[i]] = block[rows]
    for out in outs:
        out.flush()
    del outs
    return [f"part{i}/{rel}.npy" for i in range(num_parts)]


def _write(
    graph: HeteroGraph,
    graph_name: str,
    method: str,
    halo_hops: int,
    r: Reshuffled,
    out_dir: Path,
    overwrite: bool,
    metis_edge_cut: int | None,
) -> Path:
    num_parts = r.node_map.shape[0]
    ntypes, etypes = graph.ntypes, graph.canonical_etypes
    node_type_ranges = _node_type_ranges(graph, r)
    edge_ranges = edge_type_ranges(r)
    parts_files: list[dict] = [dict(node_feats={}, edge_feats={}) for _ in range(num_parts)]
    with PartitionWriter(out_dir, graph_name, overwrite) as writer:
        _write_structure(writer, r, halo_hops, graph.total_nodes, parts_files)
        node_feats = _write_node_feats(writer, graph, r, node_type_ranges, parts_files)
        edge_feats = _write_edge_feats(writer, graph, r, edge_ranges, parts_files)
        parts = []
        for i in range(num_parts):
            owned, halo, edges = parts_files[i]["local"]
            parts.append(
                PartInfo(
                    dir=f"part{i}",
                    num_owned_nodes=owned,
                    num_halo_nodes=halo,
                    num_edges=edges,
                    files=parts_files[i]["files"],
                    node_feats=parts_files[i]["node_feats"],
                    edge_feats=parts_files[i]["edge_feats"],
                )
            )
        writer.save("orig_nid.npy", r.orig_nid)
        writer.save("orig_eid.npy", r.orig_eid)
        extra = {"num_classes": graph.num_classes}
        if metis_edge_cut is not None:
            extra["metis_edge_cut"] = metis_edge_cut
        meta = PartitionMeta(
            root=out_dir,
            graph_name=graph_name,
            num_nodes=graph.total_nodes,
            num_edges=graph.num_edges(),
            num_parts=num_parts,
            part_method=method,
            halo_hops=halo_hops,
            node_map=r.node_map.tolist(),
            edge_map=r.edge_map.tolist(),
            ntypes=ntypes,
            etypes=[etype_str(e) for e in etypes],
            node_type_ranges=node_type_ranges.tolist(),
            edge_type_ranges=edge_ranges.tolist(),
            node_feats=node_feats,
            edge_feats=edge_feats,
            orig_nid="orig_nid.npy",
            orig_eid="orig_eid.npy",
            parts=parts,
            extra=extra,
        )
        return writer.commit(meta)


def _node_type_ranges(graph: HeteroGraph, r: Reshuffled) -> np.ndarray:
    """``(P, T, 2)``: each (partition, node type)'s new id range (new ids are (partition, original homogeneous
    id) ordered)."""
    num_parts, ntypes = r.node_map.shape[0], graph.ntypes
    offsets = graph.node_offsets()
    node_offsets = np.array([offsets[t] for t in ntypes] + [graph.total_nodes], dtype=np.int64)
    node_types = np.searchsorted(node_offsets[1:], r.orig_nid, side="right")
    node_part = np.searchsorted(r.node_map[:, 1], np.arange(graph.total_nodes), side="right")
    node_sizes = np.bincount(node_part * len(ntypes) + node_types, minlength=num_parts * len(ntypes))
    return _type_ranges(node_sizes.reshape(num_parts, len(ntypes)))


def _write_structure(
    writer: PartitionWriter, r: Reshuffled, halo_hops: int, total_nodes: int, parts_files: list[dict]
) -> None:
    """Each partition's CSC and local-to-global arrays; their paths and counts go into ``parts_files``."""
    scratch = np.empty(total_nodes, dtype=np.int64)
    for i in range(r.node_map.shape[0]):
        local = local_partition(r, i, halo_hops, scratch)
        (e0, e1) = r.edge_map[i]
        arrays = {
            "indptr": local.indptr,
            "indices": local.indices,
            "eids": local.eids,
            "local2global": local.local2global,
        }
        parts_files[i]["files"] = {name: writer.save(f"part{i}/{name}.npy", arrays[name]) for name in PART_ARRAYS}
        parts_files[i]["local"] = (local.num_owned, local.num_halo, int(e1 - e0))
        logger.info("part %d: %d owned, %d halo nodes, %d edges", i, local.num_owned, local.num_halo, int(e1 - e0))
        del arrays, local


def _write_node_feats(
    writer: PartitionWriter, graph: HeteroGraph, r: Reshuffled, type_ranges: np.ndarray, parts_files: list[dict]
) -> dict[str, FeatureSpec]:
    """Every node feature, its rows moved to their partitions' files (paths into ``parts_files``)."""
    offsets = graph.node_offsets()
    specs: dict[str, FeatureSpec] = {}
    for t, ntype in enumerate(graph.ntypes):
        arrays = graph.ndata.get(ntype, {})
        if not arrays:
            continue
        new_pos, part_starts = _per_type_order(r.orig_nid, type_ranges[:, t], offsets[ntype])
        for name, arr in arrays.items():
            key = feature_key(ntype, name, DEFAULT_NTYPE)
            _scatter_into_parts(writer, arr, f"node_feat/{key}", new_pos, part_starts, parts_files, "node_feats", key)
            specs[key] = FeatureSpec(str(arr.dtype), tuple(int(d) for d in arr.shape))
    return specs


def _write_edge_feats(
    writer: PartitionWriter, graph: HeteroGraph, r: Reshuffled, type_ranges: np.ndarray, parts_files: list[dict]
) -> dict[str, FeatureSpec]:
    """Every edge feature (``reverse_eid`` renumbered), its rows moved to their partitions' files."""
    etypes = graph.canonical_etypes
    edge_offsets = np.cumsum([0] + [graph.num_edges(e) for e in etypes], dtype=np.int64)
    specs: dict[str, FeatureSpec] = {}
    for t, etype in enumerate(etypes):
        arrays = graph.edata.get(etype, {})
        if not arrays:
            continue
        new_pos, part_starts = _per_type_order(r.orig_eid, type_ranges[:, t], int(edge_offsets[t]))
        for name, arr in arrays.items():
            key = feature_key(etype_str(etype), name, etype_str(DEFAULT_ETYPE))
            if name == "reverse_eid":
                arr = _remap_reverse_eids(arr, r.orig_eid, etype, graph)
            _scatter_into_parts(writer, arr, f"edge_feat/{key}", new_pos, part_starts, parts_files, "edge_feats", key)
            specs[key] = FeatureSpec(str(arr.dtype), tuple(int(d) for d in arr.shape))
    return specs


def _scatter_into_parts(
    writer: PartitionWriter,
    arr: np.ndarray,
    stem: str,
    new_pos: np.ndarray,
    part_starts: np.ndarray,
    parts_files: list[dict],
    kind: str,
    key: str,
) -> None:
    for i, path in enumerate(_scatter_feature(writer, arr, stem, new_pos, part_starts)):
        parts_files[i][kind][key] = path


def _per_type_order(orig_ids: np.ndarray, ranges: np.ndarray, type_offset: int) -> tuple[np.ndarray, np.ndarray]:
    """For one type: ``(new per-type position of each original per-type id, (P+1,) partition starts)``.

    ``orig_ids``: original homogeneous id of each new homogeneous id; ``ranges``: ``(P, 2)`` the type's
    homogeneous range in each partition.
    """
    sizes = ranges[:, 1] - ranges[:, 0]
    starts = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=starts[1:])
    new_pos = np.empty(int(starts[-1]), dtype=np.int64)
    for i, (a, b) in enumerate(ranges.tolist()):
        new_pos[orig_ids[a:b] - type_offset] = np.arange(starts[i], starts[i + 1], dtype=np.int64)
    return new_pos, starts


def _remap_reverse_eids(arr: FeatureArray, orig_eid: np.ndarray, etype, graph: HeteroGraph) -> np.ndarray:
    """An edge array ``reverse_eid`` of original edge ids, as new edge ids (homogeneous graphs)."""
    if len(graph.edges) != 1:
        raise InputError("an edge array 'reverse_eid' is supported on graphs with one edge type")
    values = np.asarray(arr.read() if isinstance(arr, ChunkedArray) else arr)
    if values.ndim != 1 or values.dtype.kind not in "iu":
        raise InputError(
            f"edge array 'reverse_eid' must be 1-d integer edge ids, got {values.dtype}{list(values.shape)}"
        )
    count = graph.num_edges(etype)
    if values.size and (values.min() < 0 or values.max() >= count):
        raise InputError(f"edge array 'reverse_eid' holds ids outside [0, {count})")
    new_of_orig = np.empty(count, dtype=np.int64)
    new_of_orig[orig_eid] = np.arange(count, dtype=np.int64)
    return new_of_orig[values]
