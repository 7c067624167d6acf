"""The partition tool (CLI ``distgnn-partition``), the on-disk partition format and the partition book.

The runtime reads only ``format`` and ``book``; the partitioner (``partition_graph``) loads on first use, and
nothing here touches the servers or rpc. ``distributed`` runs the tool as W ranks of torch.distributed (gloo)
over a chunked graph no process reads whole (``--local``: ranks forked after one torch import). May import:
errors, launch, data.
"""

from __future__ import annotations

import importlib

__all__ = ["check_partition", "partition_graph"]

_EXPORTS = {"partition_graph": "distgnn.partition.partitioner", "check_partition": "distgnn.partition.check"}


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'distgnn.partition' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
