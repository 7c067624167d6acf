"""Random CSC graphs for the sampler tests (CPU and GPU)."""

from __future__ import annotations

import numpy as np


def random_csc(rng: np.random.Generator, num_nodes: int, max_degree: int, index_dtype=np.int64):
    """A numpy CSC graph ``(indptr, indices)`` where about a fifth of the nodes have no in-edges."""
    degrees = rng.integers(0, max_degree + 1, num_nodes)
    degrees[rng.random(num_nodes) < 0.2] = 0
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(degrees, out=indptr[1:])
    indices = rng.integers(0, num_nodes, int(indptr[-1])).astype(index_dtype)
    return indptr, indices
