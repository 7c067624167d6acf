"""Plain numpy temporal sampling, the reference the C++ and CUDA kernels are tested against."""

from __future__ import annotations

import numpy as np

from distgnn.temporal.graph import TemporalCSR


def candidates(csr: TemporalCSR, root: int, root_time: float) -> np.ndarray:
    """CSR positions of ``root``'s entries strictly before ``root_time``, oldest first (int64)."""
    begin, end = int(csr.indptr[root]), int(csr.indptr[root + 1])
    return np.arange(begin, end, dtype=np.int64)[csr.times[begin:end] < root_time]


def sample_recent_reference(
    csr: TemporalCSR, roots: np.ndarray, root_times: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The ``k`` most recent entries strictly before each root's time, oldest first.

    Returns:
        neighbors int64 [R, k], times float64 [R, k], eids int64 [R, k] (unused slots -1, 0.0, -1),
        counts int64 [R].
    """
    num_roots = len(roots)
    neighbors = np.full((num_roots, k), -1, dtype=np.int64)
    times = np.zeros((num_roots, k), dtype=np.float64)
    eids = np.full((num_roots, k), -1, dtype=np.int64)
    counts = np.zeros(num_roots, dtype=np.int64)
    for i, (root, root_time) in enumerate(zip(roots, root_times, strict=True)):
        picked = candidates(csr, int(root), float(root_time))[-k:] if k else np.empty(0, dtype=np.int64)
        counts[i] = len(picked)
        neighbors[i, : len(picked)] = csr.neighbors[picked]
        times[i, : len(picked)] = csr.times[picked]
        eids[i, : len(picked)] = csr.eids[picked]
    return neighbors, times, eids, counts
