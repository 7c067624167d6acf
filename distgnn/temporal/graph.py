"""The time-sorted CSR of an event stream: per node, its events' neighbours, times and event ids.

Built once from an :class:`~distgnn.data.events.EventStream`; every node's stretch is ascending in time
(events of equal time keep stream order), which the temporal sampler's binary search relies on. With
``undirected`` (TGN's view) each event appears under both of its endpoints.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from distgnn.data.events import EventStream


@dataclass(frozen=True)
class TemporalCSR:
    """Per-node event lists, time-sorted.

    Attributes:
        indptr: int64 [N + 1]; node v's entries are positions ``indptr[v]:indptr[v+1]``.
        neighbors: int64 [M], the other endpoint of each entry's event.
        times: float64 [M], the event's time, ascending within each node.
        eids: int64 [M], the event's index in the stream.
    """

    indptr: np.ndarray
    neighbors: np.ndarray
    times: np.ndarray
    eids: np.ndarray

    @property
    def num_nodes(self) -> int:
        return int(self.indptr.shape[0] - 1)

    @property
    def num_entries(self) -> int:
        return int(self.neighbors.shape[0])


def build_temporal_csr(events: EventStream, undirected: bool = True) -> TemporalCSR:
    """The time-sorted CSR of ``events`` (sorted by time, as every EventStream is).

    Args:
        events: the stream.
        undirected: list each event under its source (neighbour: the destination) and under its
            destination (neighbour: the source); else under its source only.
    """
    num_events = len(events)
    if undirected:
        owner = np.stack([events.src, events.dst], axis=1).ravel()
        neighbor = np.stack([events.dst, events.src], axis=1).ravel()
        eid = np.repeat(np.arange(num_events, dtype=np.int64), 2)
    else:
        owner, neighbor, eid = events.src, events.dst, np.arange(num_events, dtype=np.int64)
    # Entries are in time order already; a stable sort by owner keeps each node's stretch time-sorted.
    order = np.argsort(owner, kind="stable")
    indptr = np.zeros(events.num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=events.num_nodes), out=indptr[1:])
    return TemporalCSR(
        indptr,
        np.ascontiguousarray(neighbor[order]),
        np.ascontiguousarray(events.time[eid[order]]),
        np.ascontiguousarray(eid[order]),
    )
