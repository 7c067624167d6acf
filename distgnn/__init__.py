"""distgnn: distributed graph neural network training.

The public names below load their modules on first use, so ``import distgnn``
stays cheap (the launcher and partitioner import parts of it without torch).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "initialize": "distgnn.client.context",
    "shutdown": "distgnn.client.context",
    "JobConfig": "distgnn.config",
    "DistGraph": "distgnn.client.graph",
    "DistTensor": "distgnn.client.tensor",
    "DistEmbedding": "distgnn.client.embedding",
    "SparseAdagrad": "distgnn.client.embedding",
    "SparseAdam": "distgnn.client.embedding",
    "node_split": "distgnn.client.split",
    "edge_split": "distgnn.client.split",
    "RangePartitionBook": "distgnn.partition.book",
    "Block": "distgnn.sampling.block",
    "NeighborSampler": "distgnn.sampling.neighbor",
    "DistNodeDataLoader": "distgnn.loader.node",
    "DistEdgeDataLoader": "distgnn.loader.edge",
    "LocalCluster": "distgnn.train.cluster",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'distgnn' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
