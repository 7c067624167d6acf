"""Large synthetic snapshot sequences with skewed snapshot sizes, for scheduling and scaling benchmarks.

The node set grows from ``start_fraction * num_nodes`` to ``num_nodes`` over the sequence, and each snapshot's
edge count is its node count times ``avg_degree`` times a log-normal burst, so late snapshots and bursts cost
far more than early ones: a contiguous split of the sequence is unbalanced. Node popularity is skewed
(endpoints drawn as ``floor(n * u^2)``). Features are random; the target mixes a node's last feature with its
in-neighbours' mean, so a graph convolution helps. Everything is vectorised numpy and depends on the seed only.
"""

from __future__ import annotations

import numpy as np

from distgnn.errors import InputError
from distgnn.snapshot.sequence import Snapshot, SnapshotSequence


def synthetic_sequence(
    num_nodes: int = 100_000,
    num_snapshots: int = 200,
    num_features: int = 4,
    avg_degree: float = 4.0,
    start_fraction: float = 0.05,
    burst_sigma: float = 0.6,
    seed: int = 0,
) -> SnapshotSequence:
    """A growing skewed :class:`SnapshotSequence` of node regression.

    Args:
        num_nodes: nodes of the last snapshot (10^5 to 10^6 for benchmarks).
        num_snapshots: T.
        num_features: F, features per node.
        avg_degree: mean edges per node before the burst factor.
        start_fraction: first snapshot's share of the nodes.
        burst_sigma: sigma of the log-normal factor on each snapshot's edge count (0: none).
        seed: everything follows from it.
    """
    if num_nodes < 1 or num_snapshots < 1 or num_features < 1:
        raise InputError(
            f"synthetic sequence: nodes {num_nodes}, snapshots {num_snapshots}, features {num_features}; "
            "each must be at least 1"
        )
    if not 0 < start_fraction <= 1:
        raise InputError(f"synthetic sequence: start_fraction {start_fraction}, expected in (0, 1]")
    rng = np.random.default_rng(seed)
    sizes = np.linspace(start_fraction, 1.0, num_snapshots) * num_nodes
    sizes = np.maximum(sizes.astype(np.int64), 1)
    bursts = rng.lognormal(0.0, burst_sigma, num_snapshots) if burst_sigma > 0 else np.ones(num_snapshots)
    edge_counts = (sizes * avg_degree * bursts).astype(np.int64)
    children = np.random.SeedSequence(seed).spawn(num_snapshots)
    snapshots = []
    for t in range(num_snapshots):
        snapshots.append(
            _snapshot(int(sizes[t]), int(edge_counts[t]), num_features, np.random.default_rng(children[t]))
        )
    return SnapshotSequence(snapshots, f"synthetic-{num_nodes}x{num_snapshots}-s{seed}", growing=True)


def _snapshot(n: int, num_edges: int, num_features: int, rng: np.random.Generator) -> Snapshot:
    src = (n * rng.random(num_edges) ** 2).astype(np.int64)
    dst = (n * rng.random(num_edges) ** 2).astype(np.int64)
    x = rng.standard_normal((n, num_features), dtype=np.float32)
    last = x[:, -1].astype(np.float64)
    in_degree = np.bincount(dst, minlength=n)
    neighbour_mean = np.bincount(dst, weights=last[src], minlength=n) / np.maximum(in_degree, 1)
    y = 0.5 * last + 0.5 * neighbour_mean + 0.1 * rng.standard_normal(n)
    return Snapshot(np.stack([src, dst]), None, x, y.astype(np.float32), n)
