"""The offline partition tool (installed as ``distgnn.partition``).

Imports only numpy, pymetis, the on-disk format module and the partition book;
never the runtime's server or rpc code. ``partition_graph`` loads on first use,
so the runtime can import ``distgnn.partition.format`` without the partitioner.
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
