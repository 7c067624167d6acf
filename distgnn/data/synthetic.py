"""Synthetic community graphs from tiny to ogbn-products scale and beyond.

The generator is a degree-corrected stochastic block model: every node draws a
power-law weight (its expected degree up to a constant) and a community, which
is also its label. An undirected edge picks its first endpoint by weight; with
probability ``intra`` the second endpoint comes from the same community
(again by weight), otherwise from the whole graph. Features are the class
centroid plus heavier Gaussian noise, so a model that only sees a node's own
features does poorly while averaging over neighbours (mostly of the same
class) removes the noise: a GNN beats an MLP. Everything is vectorised and
deterministic by seed; at products scale (2.4M nodes, ~62M directed edges,
100-dim features) it takes well under a minute and a few GiB.
"""

from __future__ import annotations

import numpy as np

from distgnn.data.graph import Graph
from distgnn.errors import InputError

# Edges are drawn in chunks so the scratch arrays stay small at scale.
_CHUNK = 1 << 22
# Each node appears about this many times per unit of weight in the draw table.
_TABLE_RESOLUTION = 4


def unique_sorted(keys: np.ndarray) -> np.ndarray:
    """Sorted distinct values of ``keys`` (sorted in place): a sort and one compare, where np.unique on recent
    numpy hashes first, which is slower for these int64 keys."""
    keys.sort()
    keep = np.empty(keys.shape[0], dtype=bool)
    keep[:1] = True
    np.not_equal(keys[1:], keys[:-1], out=keep[1:])
    return keys[keep]


def synthetic(
    num_nodes: int,
    avg_degree: float,
    feat_dim: int = 100,
    num_classes: int = 16,
    seed: int = 0,
    *,
    intra: float = 0.8,
    signal: float = 1.4,
    power_law_exponent: float = 3.0,
    train_frac: float = 0.1,
    val_frac: float = 0.05,
    name: str = "synthetic",
) -> Graph:
    """Generate a symmetric power-law community graph.

    Args:
        num_nodes: node count N (>= 2).
        avg_degree: mean number of directed edges per node; the graph holds about
            ``N * avg_degree`` directed edges (both directions of each undirected
            edge; self loops and duplicate pairs are dropped, so slightly fewer).
        feat_dim: F, width of ``ndata["feat"]`` (float32).
        num_classes: C, number of communities (= labels).
        seed: every array is a deterministic function of the arguments and seed.
        intra: probability that an edge stays inside its first endpoint's community.
        signal: scale of the class centroids against unit Gaussian noise: centroid
            entries have standard deviation ``signal / sqrt(F)``, so the distance
            between classes (and the accuracy of a features-only model) does not
            grow with F.
        power_law_exponent: exponent of the degree distribution's tail (> 2).
        train_frac, val_frac: fractions of nodes in the train and val masks; the
            rest form the test mask.

    Returns:
        Graph with ``src``/``dst`` int64 ``(E,)``, ndata ``feat``
        float32 ``(N, F)``, ``label`` int64 ``(N,)``, boolean ``train_mask``,
        ``val_mask``, ``test_mask``, and ``num_classes = C``.
    """
    _check_synthetic_args(num_nodes, avg_degree, feat_dim, num_classes, intra, train_frac, val_frac)
    if power_law_exponent <= 2:
        raise InputError(f"power_law_exponent must be > 2 (finite mean degree), got {power_law_exponent}")
    rng = np.random.default_rng(seed)
    n = int(num_nodes)
    label = rng.integers(0, num_classes, size=n, dtype=np.int64)
    # Pareto(a) + 1 has a tail P(w > x) ~ x^-a, so degrees follow a power law with exponent a + 1.
    weight = rng.pareto(power_law_exponent - 1.0, size=n) + 1.0
    src, dst = _community_edges(rng, label, weight, num_classes, int(round(n * avg_degree / 2)), intra)
    ndata = {
        "feat": class_features(rng, label, num_classes, feat_dim, signal),
        "label": label,
        **split_masks(rng, n, train_frac, val_frac),
    }
    return Graph(name, n, src, dst, ndata=ndata, num_classes=num_classes)


def _check_synthetic_args(
    num_nodes: int, avg_degree: float, feat_dim: int, num_classes: int, intra: float, train_frac: float, val_frac: float
) -> None:
    if num_nodes < 2:
        raise InputError(f"synthetic graph needs num_nodes >= 2, got {num_nodes}")
    if avg_degree <= 0 or feat_dim < 1 or num_classes < 1:
        raise InputError(
            f"synthetic graph needs avg_degree > 0, feat_dim >= 1, num_classes >= 1; "
            f"got {avg_degree}, {feat_dim}, {num_classes}"
        )
    if not (0 <= intra <= 1 and min(train_frac, val_frac) >= 0 and train_frac + val_frac <= 1):
        raise InputError("synthetic graph needs 0 <= intra <= 1 and train_frac + val_frac <= 1")


def _community_edges(
    rng: np.random.Generator, label: np.ndarray, weight: np.ndarray, num_classes: int, num_pairs: int, intra: float
) -> tuple[np.ndarray, np.ndarray]:
    """``(src, dst)`` int64: both directions of ``num_pairs`` weighted draws (a pair stays in its first node's
    community with probability ``intra``), self loops and repeated pairs dropped."""
    n = label.shape[0]
    # Draw table: node ids sorted by community, node i repeated ~weight_i times, so a
    # weighted draw is one uniform integer (a community is a contiguous slice of it).
    by_comm = np.argsort(label, kind="stable")
    copies = np.maximum(np.rint(weight[by_comm] * _TABLE_RESOLUTION), 1).astype(np.int64)
    table = np.repeat(by_comm, copies)
    comm_sizes = np.bincount(np.repeat(label[by_comm], copies), minlength=num_classes)
    comm_hi = np.cumsum(comm_sizes)
    comm_lo = comm_hi - comm_sizes
    del by_comm, copies

    keys = np.empty(num_pairs, dtype=np.int64)
    for start in range(0, num_pairs, _CHUNK):
        m = min(_CHUNK, num_pairs - start)
        u = table[rng.integers(0, table.shape[0], size=m)]
        comm = label[u]
        inside = rng.random(m) < intra
        lo = np.where(inside, comm_lo[comm], 0)
        hi = np.where(inside, comm_hi[comm], table.shape[0])
        v = table[lo + (rng.random(m) * (hi - lo)).astype(np.int64)]
        a, b = np.minimum(u, v), np.maximum(u, v)
        keys[start : start + m] = np.where(a == b, -1, a * n + b)
    del table
    keys = unique_sorted(keys)
    if keys.size and keys[0] < 0:
        keys = keys[1:]
    a, b = np.divmod(keys, n)
    return np.concatenate([a, b]), np.concatenate([b, a])


def class_features(
    rng: np.random.Generator, label: np.ndarray, num_classes: int, feat_dim: int, signal: float
) -> np.ndarray:
    """float32 ``(n, feat_dim)``: unit Gaussian noise plus the centroid of each node's class (entries of standard
    deviation ``signal / sqrt(feat_dim)``, so a features-only model's accuracy does not grow with the width)."""
    centroids = rng.standard_normal((num_classes, feat_dim), dtype=np.float32)
    centroids *= np.float32(signal / np.sqrt(feat_dim))
    feat = rng.standard_normal((label.shape[0], feat_dim), dtype=np.float32)
    block = _CHUNK // feat_dim + 1
    for start in range(0, label.shape[0], block):
        feat[start : start + block] += centroids[label[start : start + block]]
    return feat


def split_masks(rng: np.random.Generator, n: int, train_frac: float, val_frac: float) -> dict[str, np.ndarray]:
    """Boolean ``train_mask`` / ``val_mask`` / ``test_mask`` of ``n`` nodes, drawn with the given fractions."""
    split = rng.random(n)
    return {
        "train_mask": split < train_frac,
        "val_mask": (split >= train_frac) & (split < train_frac + val_frac),
        "test_mask": split >= train_frac + val_frac,
    }
