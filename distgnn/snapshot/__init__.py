"""Snapshot sequences: discrete-time dynamic graphs, their readers, BLAD's load-balanced window scheduling and
recurrent-GNN training. May import every component but temporal.

* :mod:`~distgnn.snapshot.sequence`: :class:`SnapshotSequence` (graphs over a fixed or growing node set).
* :mod:`~distgnn.snapshot.pgt`: PyTorch Geometric Temporal's JSON layouts, recognised by their keys.
* :mod:`~distgnn.snapshot.synthetic`: large skewed sequences for benchmarks.
"""

from distgnn.snapshot.pgt import read_pgt_json
from distgnn.snapshot.sequence import DeviceSnapshot, Snapshot, SnapshotSequence, to_device
from distgnn.snapshot.synthetic import synthetic_sequence

__all__ = ["DeviceSnapshot", "Snapshot", "SnapshotSequence", "read_pgt_json", "synthetic_sequence", "to_device"]
