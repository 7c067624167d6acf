"""A small heterogeneous graph for tests: three node types, four edge types, in-memory and chunked arrays."""

from __future__ import annotations

import numpy as np

from distgnn.data.hetero import ChunkedArray, HeteroGraph

ETYPES = [("a", "r1", "b"), ("b", "r2", "a"), ("a", "r3", "a"), ("c", "r4", "b")]


def chunked(arr: np.ndarray, pieces: int) -> ChunkedArray:
    bounds = np.linspace(0, len(arr), pieces + 1).astype(int)
    chunks = [(int(b - a), (lambda a=a, b=b: arr[a:b].copy())) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return ChunkedArray(chunks, arr.dtype, arr.shape[1:], "test array")


def toy_hetero(seed: int = 0) -> HeteroGraph:
    rng = np.random.default_rng(seed)
    num_nodes = {"a": 60, "b": 40, "c": 15}
    edges = {}
    for s, r, d in ETYPES:
        m = int(rng.integers(80, 150))
        edges[(s, r, d)] = (rng.integers(0, num_nodes[s], m), rng.integers(0, num_nodes[d], m))
    train = np.zeros(60, dtype=bool)
    train[rng.choice(60, 20, replace=False)] = True
    ndata = {
        "a": {
            "feat": rng.normal(size=(60, 4)).astype(np.float32),
            "label": rng.integers(0, 3, 60),
            "train_mask": train,
        },
        "b": {"feat": chunked(rng.normal(size=(40, 3)).astype(np.float32), 3)},
    }
    edata = {("a", "r1", "b"): {"w": chunked(rng.random(len(edges[ETYPES[0]][0])).astype(np.float32), 2)}}
    return HeteroGraph("toy", num_nodes, edges, ndata, edata, num_classes=3)
