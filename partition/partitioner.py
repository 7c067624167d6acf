"""``partition_graph``: assign, reshuffle and write a graph in the on-disk format.

Phases (each logged with its time): METIS or random assignment, reshuffle
(new ids and the global CSC), write (per-partition arrays and features through
``PartitionWriter``, which stages beside the output and renames into place).
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
from distgnn.errors import InputError
from distgnn.partition.assign import METHODS, metis_assignment, random_assignment
from distgnn.partition.format import (
    PART_ARRAYS,
    FeatureSpec,
    PartInfo,
    PartitionMeta,
    PartitionWriter,
    check_output_dir,
)
from distgnn.partition.reshuffle import Reshuffled, local_partition, reshuffle

logger = logging.getLogger(__name__)

# Graph and feature names become file names.
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def _check_name(name: str, what: str) -> None:
    if not _NAME.match(name):
        raise InputError(f"{what} {name!r} must be letters, digits, '_', '.', '-' (not starting with '.' or '-')")


def _check_args(graph: Graph, num_parts: int, graph_name: str, method: str, halo_hops: int) -> None:
    _check_name(graph_name, "graph name")
    for name in (*graph.ndata, *graph.edata):
        _check_name(name, "feature name")
    if method not in METHODS:
        raise InputError(f"unknown partition method {method!r}; expected one of {', '.join(METHODS)}")
    if not 1 <= num_parts <= max(graph.num_nodes, 1):
        raise InputError(f"num_parts must be between 1 and the node count {graph.num_nodes}, got {num_parts}")
    if halo_hops < 1:
        raise InputError(f"halo_hops must be >= 1 (HALO nodes hold the sources of cut edges), got {halo_hops}")


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
    graph: Graph,
    num_parts: int,
    out_dir: str | os.PathLike,
    graph_name: str | None = None,
    method: str = "metis",
    balance_train: bool = False,
    balance_edges: bool = False,
    halo_hops: int = 1,
    seed: int = 0,
    overwrite: bool = False,
    metis_coarsen: str = "auto",
) -> Path:
    """Partition ``graph`` into ``num_parts`` and write it under ``out_dir``.

    Args:
        graph: the input; every ``ndata``/``edata`` array becomes a node/edge feature.
        num_parts: K, between 1 and the node count.
        out_dir: output directory; must be absent, empty, or (with ``overwrite``)
            hold a partition of the same graph name.
        graph_name: defaults to ``graph.name``; names the JSON file.
        method: ``"metis"`` or ``"random"``.
        balance_train: METIS balances train nodes (``ndata["train_mask"]``) per part.
        balance_edges: METIS balances in-edges per part.
        halo_hops: HALO nodes are the non-owned nodes within this many in-hops.
        seed: METIS / random seed.
        metis_coarsen: ``"auto"`` (large graphs are clustered and contracted in numpy
            before METIS, which needs a fraction of METIS's memory), ``"on"`` or
            ``"off"`` (the whole graph to METIS); see ``distgnn.partition.coarsen``.

    Returns:
        Path of the written ``<graph_name>.json``.
    """
    graph_name = graph_name or graph.name
    graph.validate()
    _check_args(graph, num_parts, graph_name, method, halo_hops)
    out_dir = Path(out_dir).resolve()
    check_output_dir(out_dir, graph_name, overwrite)
    src = graph.src.astype(np.int64, copy=False)
    dst = graph.dst.astype(np.int64, copy=False)
    n = graph.num_nodes

    edge_cut = None
    with _Phase(f"{method} partition into {num_parts}"):
        if method == "metis":
            train_mask = None
            if balance_train:
                if "train_mask" not in graph.ndata:
                    raise InputError("balance_train needs a node array 'train_mask'; the graph has none")
                train_mask = graph.ndata["train_mask"].astype(bool, copy=False)
            part, edge_cut = metis_assignment(
                n, src, dst, num_parts, train_mask, balance_edges, seed, coarsen=metis_coarsen
            )
        else:
            part = random_assignment(n, num_parts, seed)
    with _Phase("reshuffle"):
        shuffled = reshuffle(n, src, dst, part, num_parts)
    del part
    with _Phase("write"):
        json_path = _write(graph, graph_name, method, halo_hops, shuffled, out_dir, overwrite, edge_cut)
    logger.info("wrote %s", json_path)
    return json_path


def _write(
    graph: Graph,
    graph_name: str,
    method: str,
    halo_hops: int,
    r: Reshuffled,
    out_dir: Path,
    overwrite: bool,
    metis_edge_cut: int | None,
) -> Path:
    num_parts = r.node_map.shape[0]
    scratch = np.empty(graph.num_nodes, dtype=np.int64)
    parts: list[PartInfo] = []
    with PartitionWriter(out_dir, graph_name, overwrite) as writer:
        for i in range(num_parts):
            local = local_partition(r, i, halo_hops, scratch)
            (n0, n1), (e0, e1) = r.node_map[i], r.edge_map[i]
            arrays = {
                "indptr": local.indptr,
                "indices": local.indices,
                "eids": np.arange(e0, e1, dtype=np.int64),
                "local2global": local.local2global,
            }
            files = {name: writer.save(f"part{i}/{name}.npy", arrays[name]) for name in PART_ARRAYS}
            del arrays
            node_feats = {
                name: writer.save(f"part{i}/node_feat/{name}.npy", arr[r.orig_nid[n0:n1]])
                for name, arr in graph.ndata.items()
            }
            edge_feats = {
                name: writer.save(f"part{i}/edge_feat/{name}.npy", arr[r.orig_eid[e0:e1]])
                for name, arr in graph.edata.items()
            }
            parts.append(
                PartInfo(
                    dir=f"part{i}",
                    num_owned_nodes=local.num_owned,
                    num_halo_nodes=local.num_halo,
                    num_edges=int(e1 - e0),
                    files=files,
                    node_feats=node_feats,
                    edge_feats=edge_feats,
                )
            )
            logger.info("part %d: %d owned, %d halo nodes, %d edges", i, local.num_owned, local.num_halo, int(e1 - e0))
        writer.save("orig_nid.npy", r.orig_nid)
        writer.save("orig_eid.npy", r.orig_eid)
        extra = {"num_classes": graph.num_classes}
        if metis_edge_cut is not None:
            extra["metis_edge_cut"] = metis_edge_cut
        meta = PartitionMeta(
            root=out_dir,
            graph_name=graph_name,
            num_nodes=graph.num_nodes,
            num_edges=graph.num_edges,
            num_parts=num_parts,
            part_method=method,
            halo_hops=halo_hops,
            node_map=r.node_map.tolist(),
            edge_map=r.edge_map.tolist(),
            ntypes=["_N"],
            etypes=["_E"],
            node_feats={k: FeatureSpec(str(v.dtype), tuple(v.shape)) for k, v in graph.ndata.items()},
            edge_feats={k: FeatureSpec(str(v.dtype), tuple(v.shape)) for k, v in graph.edata.items()},
            orig_nid="orig_nid.npy",
            orig_eid="orig_eid.npy",
            parts=parts,
            extra=extra,
        )
        return writer.commit(meta)
