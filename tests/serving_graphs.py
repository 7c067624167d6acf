"""Small partitioned graphs and a leak check for the serving tests (RPC, servers, cluster, tensors).

``write_range_partitions`` splits node ids into even contiguous ranges (no
reshuffling, so new ids equal original ids) and writes them through the
format module, which keeps these tests independent of the partitioner.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from distgnn.partition.format import FeatureSpec, PartInfo, PartitionMeta, PartitionWriter
from distgnn.store.shm import SHM_DIR


@dataclass
class RangeGraph:
    """The global view the tests compare against (new ids == original node ids)."""

    json_path: Path
    num_nodes: int
    src: np.ndarray  # in new edge-id order
    dst: np.ndarray
    ndata: dict[str, np.ndarray]
    edata: dict[str, np.ndarray]
    node_map: np.ndarray
    edge_map: np.ndarray


def random_edges(num_nodes: int, num_edges: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, num_nodes, num_edges), rng.integers(0, num_nodes, num_edges)


def write_range_partitions(
    out_dir: Path,
    num_nodes: int,
    src: np.ndarray,
    dst: np.ndarray,
    num_parts: int,
    ndata: dict[str, np.ndarray],
    edata: dict[str, np.ndarray] | None = None,
    name: str = "g",
) -> RangeGraph:
    edata = edata or {}
    order = np.lexsort((src, dst))  # CSC order: by destination, then source
    src, dst = np.asarray(src, np.int64)[order], np.asarray(dst, np.int64)[order]
    edata = {k: v[order] for k, v in edata.items()}
    bounds = np.linspace(0, num_nodes, num_parts + 1).astype(np.int64)
    node_map = np.stack([bounds[:-1], bounds[1:]], axis=1)
    edge_bounds = np.searchsorted(dst, bounds)
    edge_map = np.stack([edge_bounds[:-1], edge_bounds[1:]], axis=1)
    parts = []
    with PartitionWriter(out_dir, name) as writer:
        for i, ((ns, ne), (es, ee)) in enumerate(zip(node_map, edge_map, strict=True)):
            psrc, pdst = src[es:ee], dst[es:ee]
            halo = np.unique(psrc[(psrc < ns) | (psrc >= ne)])
            local2global = np.concatenate([np.arange(ns, ne), halo]).astype(np.int64)
            local_of_src = np.where(
                (psrc >= ns) & (psrc < ne), psrc - ns, (ne - ns) + np.searchsorted(halo, psrc)
            ).astype(np.int32)
            indptr = np.concatenate([[0], np.cumsum(np.bincount(pdst - ns, minlength=ne - ns))]).astype(np.int64)
            d = f"part{i}"
            files = {
                "indptr": writer.save(f"{d}/indptr.npy", indptr),
                "indices": writer.save(f"{d}/indices.npy", local_of_src),
                "eids": writer.save(f"{d}/eids.npy", np.arange(es, ee, dtype=np.int64)),
                "local2global": writer.save(f"{d}/local2global.npy", local2global),
            }
            nfeats = {k: writer.save(f"{d}/node_feat/{k}.npy", v[ns:ne]) for k, v in ndata.items()}
            efeats = {k: writer.save(f"{d}/edge_feat/{k}.npy", v[es:ee]) for k, v in edata.items()}
            parts.append(PartInfo(d, int(ne - ns), len(halo), int(ee - es), files, nfeats, efeats))
        writer.save("orig_nid.npy", np.arange(num_nodes, dtype=np.int64))
        writer.save("orig_eid.npy", order.astype(np.int64))
        meta = PartitionMeta(
            root=Path(out_dir),
            graph_name=name,
            num_nodes=num_nodes,
            num_edges=len(src),
            num_parts=num_parts,
            part_method="range",
            halo_hops=1,
            node_map=node_map.tolist(),
            edge_map=edge_map.tolist(),
            ntypes=["_N"],
            etypes=["_N:_E:_N"],
            node_type_ranges=node_map[:, None, :].tolist(),
            edge_type_ranges=edge_map[:, None, :].tolist(),
            node_feats={k: FeatureSpec(v.dtype.name, v.shape) for k, v in ndata.items()},
            edge_feats={k: FeatureSpec(v.dtype.name, v.shape) for k, v in edata.items()},
            orig_nid="orig_nid.npy",
            orig_eid="orig_eid.npy",
            parts=parts,
        )
        json_path = writer.commit(meta)
    return RangeGraph(json_path, num_nodes, src, dst, ndata, edata, node_map, edge_map)


def small_graph(
    out_dir: Path, num_parts: int, num_nodes: int = 300, num_edges: int = 2000, seed: int = 0
) -> RangeGraph:
    """A random graph with float32 ``feat`` (N, 8), int64 ``label`` and bool ``train_mask``, and edge ``w``."""
    rng = np.random.default_rng(seed)
    src, dst = random_edges(num_nodes, num_edges, seed)
    ndata = {
        "feat": rng.standard_normal((num_nodes, 8)).astype(np.float32),
        "label": rng.integers(0, 5, num_nodes).astype(np.int64),
        "train_mask": rng.random(num_nodes) < 0.3,
    }
    edata = {"w": rng.random(num_edges).astype(np.float32)}
    return write_range_partitions(out_dir, num_nodes, src, dst, num_parts, ndata, edata)


def job_files(job_id: str) -> list[str]:
    return sorted(p.name for p in SHM_DIR.iterdir() if p.name.startswith(f"distgnn-{job_id}-"))


def child_processes() -> list[str]:
    """Live (non-zombie) child processes of this one, as ``"pid command"``.

    ``ps`` itself is excluded, and so are multiprocessing's resource tracker and
    forkserver: the first test that uses a spawn context starts them once for the
    whole pytest process, so they are no test's leftover.
    """
    out = subprocess.run(
        ["ps", "-ww", "-o", "pid=,stat=,args=", "--ppid", str(os.getpid())], capture_output=True, text=True, check=False
    )
    live = []
    for line in out.stdout.splitlines():
        pid, stat, args = line.split(None, 2)
        service = "multiprocessing.resource_tracker" in args or "multiprocessing.forkserver" in args
        if not stat.startswith("Z") and not args.startswith("ps ") and not service:
            live.append(f"{pid} {args}")
    return live
