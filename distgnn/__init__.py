"""distgnn: distributed graph neural network training.

The public names below load their modules on first use, so ``import distgnn``
stays cheap (the launcher and partitioner import parts of it without torch).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "initialize": "distgnn.context",
    "shutdown": "distgnn.context",
    "JobConfig": "distgnn.config",
    "DistGraph": "distgnn.graph",
    "DistTensor": "distgnn.tensor",
    "DistEmbedding": "distgnn.embedding",
    "SparseAdagrad": "distgnn.embedding",
    "SparseAdam": "distgnn.embedding",
    "node_split": "distgnn.split",
    "RangePartitionBook": "distgnn.partition_book",
    "Block": "distgnn.sampling.block",
    "NeighborSampler": "distgnn.sampling.neighbor",
    "DistNodeDataLoader": "distgnn.dataloader",
    "LocalCluster": "distgnn.cluster",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'distgnn' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
