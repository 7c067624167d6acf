"""An ogbn-papers100M-shaped graph written straight to disk in DGL's chunked format, chunk by chunk.

    python -m distgnn.data.papers_like --num-nodes N --out DIR [--avg-degree D] [--feat-dim F]
                                       [--num-classes C] [--nodes-per-chunk K] [--seed S] [--jobs J]

One node type ``paper`` and one edge type ``paper:cites:paper`` (directed, as papers100M), ``feat``
float32 ``(N, F)`` (default 128), ``label`` int64, and ``train_mask`` / ``val_mask`` / ``test_mask``
holding papers100M's fractions of the nodes. Structure: nodes sit in communities (the label is the
community modulo C); an edge's source is drawn from the whole graph and its destination, with
probability ``intra``, from the source's community, otherwise from anywhere; inside a community the
draw is skewed towards its first members (``offset = size * u ** skew``), which gives power-law
degrees. Community members are scattered over the id space by an affine permutation, so id ranges
do not follow communities. Edge chunk ``j`` and node chunk ``j`` are functions of (seed, j) alone:
nothing but one chunk is ever in memory, and the edge files are ``.npy`` ``(rows, 2)`` int64.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np

from distgnn.data.chunked import chunk_sizes
from distgnn.errors import InputError

TRAIN_FRAC, VAL_FRAC, TEST_FRAC = 0.0108, 0.0011, 0.0019  # papers100M: 1.2M / 125k / 214k of 111M
NODES_PER_CHUNK = 1 << 20
_MULTIPLIER = 1_000_003


class _Layout:
    """Positions ``[0, N)`` hold communities in consecutive ranges; node id = (a * position + b) mod N."""

    def __init__(self, num_nodes: int, num_communities: int, seed: int):
        self.n = num_nodes
        self.c = num_communities
        a = _MULTIPLIER % num_nodes or 1
        while math.gcd(a, num_nodes) != 1:
            a += 1
        self.a, self.b = a, (seed * 7919) % num_nodes
        self.a_inv = pow(a, -1, num_nodes) if num_nodes > 1 else 0
        self.starts = np.array([k * num_nodes // num_communities for k in range(num_communities + 1)], np.int64)

    def node_of(self, position: np.ndarray) -> np.ndarray:
        return (position * self.a + self.b) % self.n

    def position_of(self, node: np.ndarray) -> np.ndarray:
        # a_inv < N; split the product so it stays inside int64 for any N below 2**62 / 2**20.
        shifted = (node - self.b) % self.n
        hi, lo = self.a_inv >> 20, self.a_inv & ((1 << 20) - 1)
        return (((shifted * hi) % self.n) * (1 << 20) + shifted * lo) % self.n

    def community_of_position(self, position: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.starts[1:], position, side="right")


def _edges(layout: _Layout, rows: int, rng: np.random.Generator, intra: float, skew: float) -> np.ndarray:
    src_pos = rng.integers(0, layout.n, size=rows, dtype=np.int64)
    comm = layout.community_of_position(src_pos)
    inside = rng.random(rows) < intra
    comm = np.where(inside, comm, rng.integers(0, layout.c, size=rows, dtype=np.int64))
    lo, hi = layout.starts[comm], layout.starts[comm + 1]
    dst_pos = lo + ((hi - lo) * rng.random(rows) ** skew).astype(np.int64)
    # Sources skewed too: a few papers cite a lot, most cite a little.
    src_comm = layout.community_of_position(src_pos)
    s_lo, s_hi = layout.starts[src_comm], layout.starts[src_comm + 1]
    src_pos = s_lo + ((s_hi - s_lo) * rng.random(rows) ** skew).astype(np.int64)
    out = np.empty((rows, 2), dtype=np.int64)
    out[:, 0] = layout.node_of(src_pos)
    out[:, 1] = layout.node_of(dst_pos)
    return out


def _save(path: Path, array: np.ndarray) -> None:
    np.save(path, array, allow_pickle=False)


def write_papers_like(
    out_dir: str | os.PathLike,
    num_nodes: int,
    avg_degree: float = 14.5,
    feat_dim: int = 128,
    num_classes: int = 172,
    nodes_per_chunk: int = NODES_PER_CHUNK,
    seed: int = 0,
    *,
    intra: float = 0.8,
    skew: float = 2.0,
    signal: float = 1.4,
    overwrite: bool = False,
    jobs: int = 1,
) -> Path:
    """Write the graph under ``out_dir``; returns its ``metadata.json``. Peak memory is one chunk per job.

    Args:
        num_nodes: N (>= 2); the graph has ``round(N * avg_degree)`` directed edges (self loops and
            duplicates included, as a raw edge list may have them).
        feat_dim, num_classes: width of ``feat`` and label count (papers100M: 128, 172).
        nodes_per_chunk: rows per node chunk; edges use as many chunks as nodes.
        intra: probability that an edge stays in its source's community; skew: > 1 concentrates the
            draws on a community's first members (the degree tail); signal: class centroid scale of the
            features against unit noise.
        jobs: processes writing chunks at once (the files are the same for any number).
    """
    if num_nodes < 2 or avg_degree <= 0 or feat_dim < 1 or num_classes < 1 or nodes_per_chunk < 1 or jobs < 1:
        raise InputError(
            "papers_like needs num_nodes >= 2, avg_degree > 0, feat_dim >= 1, num_classes >= 1, "
            f"nodes_per_chunk >= 1, jobs >= 1; got {num_nodes}, {avg_degree}, {feat_dim}, {num_classes}, "
            f"{nodes_per_chunk}, {jobs}"
        )
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()) and not overwrite:
        raise InputError(f"{out_dir}: already exists and is not empty; pass overwrite to replace it")
    num_chunks = max(1, -(-num_nodes // nodes_per_chunk))
    num_communities = max(num_classes, num_nodes // 2000)
    layout = _Layout(num_nodes, num_communities, seed)
    node_rows = chunk_sizes(num_nodes, num_chunks)
    edge_rows = chunk_sizes(int(round(num_nodes * avg_degree)), num_chunks)
    centroids = np.random.default_rng([seed, 1 << 30]).standard_normal((num_classes, feat_dim), dtype=np.float32)
    centroids *= np.float32(signal / np.sqrt(feat_dim))
    staging = out_dir.parent / f".{out_dir.name}.writing-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    names = NODE_DATA
    try:
        for sub in ("edge_index", "node_data/paper"):
            (staging / sub).mkdir(parents=True)
        firsts = np.concatenate([[0], np.cumsum(node_rows)[:-1]]).tolist()
        tasks = [
            (staging, layout, j, firsts[j], node_rows[j], edge_rows[j], centroids, seed, names, intra, skew)
            for j in range(num_chunks)
        ]
        if jobs > 1:
            with ProcessPoolExecutor(min(jobs, num_chunks), mp_context=get_context("fork")) as pool:
                list(pool.map(_write_chunk, tasks))
        else:
            for task in tasks:
                _write_chunk(task)
        metadata = _metadata(node_rows, edge_rows, names, num_classes)
        (staging / "metadata.json").write_text(json.dumps(metadata, sort_keys=True, indent=4))
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir / "metadata.json"


NODE_DATA = ("feat", "label", "train_mask", "val_mask", "test_mask")


def _write_chunk(task: tuple) -> None:
    """Node chunk ``j`` (features: class centroid plus unit noise, labels, masks) and edge chunk ``j``;
    a function of (seed, j) alone."""
    staging, layout, j, first, rows, num_edges, centroids, seed, names, intra, skew = task
    num_classes = centroids.shape[0]
    rng = np.random.default_rng([seed, j, 1])
    ids = np.arange(first, first + rows, dtype=np.int64)
    label = layout.community_of_position(layout.position_of(ids)) % num_classes
    feat = rng.standard_normal((rows, centroids.shape[1]), dtype=np.float32)
    feat += centroids[label]
    split = rng.random(rows)
    arrays = {
        "feat": feat,
        "label": label,
        "train_mask": split < TRAIN_FRAC,
        "val_mask": (split >= TRAIN_FRAC) & (split < TRAIN_FRAC + VAL_FRAC),
        "test_mask": (split >= TRAIN_FRAC + VAL_FRAC) & (split < TRAIN_FRAC + VAL_FRAC + TEST_FRAC),
    }
    for name in names:
        _save(staging / "node_data/paper" / f"{name}-{j}.npy", arrays[name])
    del arrays, feat
    _save(
        staging / "edge_index" / f"paper:cites:paper{j}.npy",
        _edges(layout, num_edges, np.random.default_rng([seed, j, 2]), intra, skew),
    )


def _metadata(node_rows: list[int], edge_rows: list[int], names: tuple[str, ...], num_classes: int) -> dict:
    """The chunked format's ``metadata.json`` of the files written."""
    num_chunks = len(node_rows)
    return {
        "graph_name": "papers_like",
        "node_type": ["paper"],
        "num_nodes_per_chunk": [node_rows],
        "edge_type": ["paper:cites:paper"],
        "num_edges_per_chunk": [edge_rows],
        "edges": {
            "paper:cites:paper": {
                "format": {"name": "numpy"},
                "data": [f"edge_index/paper:cites:paper{j}.npy" for j in range(num_chunks)],
            }
        },
        "node_data": {
            "paper": {
                name: {
                    "format": {"name": "numpy"},
                    "data": [f"node_data/paper/{name}-{j}.npy" for j in range(num_chunks)],
                }
                for name in names
            }
        },
        "edge_data": {},
        "num_classes": int(num_classes),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m distgnn.data.papers_like", description=__doc__.split("\n\n")[0])
    p.add_argument("--num-nodes", type=int, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--avg-degree", type=float, default=14.5)
    p.add_argument("--feat-dim", type=int, default=128)
    p.add_argument("--num-classes", type=int, default=172)
    p.add_argument("--nodes-per-chunk", type=int, default=NODES_PER_CHUNK)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=1, help="processes writing chunks at once (the same files)")
    p.add_argument("--overwrite", action="store_true")
    args = p.parse_args(argv)
    try:
        path = write_papers_like(
            args.out,
            args.num_nodes,
            args.avg_degree,
            args.feat_dim,
            args.num_classes,
            args.nodes_per_chunk,
            args.seed,
            overwrite=args.overwrite,
            jobs=args.jobs,
        )
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
