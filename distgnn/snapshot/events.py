"""An event stream cut into snapshots: equal time spans (``--snapshot-span``) or a count (``--num-snapshots``).

Nodes are renumbered by first appearance, so the node set grows as a prefix: snapshot ``t`` holds every node
seen up to its end. A snapshot's edges are its span's events; its features are each node's
``[log(1 + out-degree), log(1 + in-degree)]`` within the span. Such a sequence has no node targets: it is
trained on next-snapshot link prediction.
"""

from __future__ import annotations

import numpy as np

from distgnn.data.events import EventStream
from distgnn.errors import InputError
from distgnn.snapshot.sequence import Snapshot, SnapshotSequence


def first_appearance_ids(src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """``src``, ``dst`` renumbered so that ids follow the order nodes first appear in (source before
    destination within an event); and how many nodes there are."""
    interleaved = np.stack([src, dst], axis=1).reshape(-1)
    nodes, first = np.unique(interleaved, return_index=True)
    rank = np.empty(len(nodes), np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(nodes))
    new = rank[np.searchsorted(nodes, interleaved)].reshape(-1, 2)
    return new[:, 0].copy(), new[:, 1].copy(), len(nodes)


def snapshots_from_events(
    stream: EventStream, span: float | None = None, num_snapshots: int | None = None, name: str = "events"
) -> SnapshotSequence:
    """Cut ``stream`` into snapshots of ``span`` seconds from its first event, or into ``num_snapshots``
    spans of equal length (exactly one of the two).

    Raises:
        InputError: neither or both given, a span or count below 1, or no events.
    """
    if (span is None) == (num_snapshots is None):
        raise InputError("cutting events into snapshots: give exactly one of --snapshot-span and --num-snapshots")
    if len(stream) == 0:
        raise InputError(f"{name}: no events, so no snapshots after cutting")
    t0, t1 = float(stream.time[0]), float(stream.time[-1])
    if span is not None:
        if not span > 0:
            raise InputError(f"--snapshot-span {span}: give a positive number of seconds")
        count = int((t1 - t0) // span) + 1
    else:
        if num_snapshots < 1:
            raise InputError(f"--num-snapshots {num_snapshots}: give at least 1")
        count = num_snapshots
        span = max(t1 - t0, 1e-9) / count
    which = np.minimum(((stream.time - t0) // span).astype(np.int64), count - 1)
    src, dst, _ = first_appearance_ids(stream.src, stream.dst)
    bounds = np.searchsorted(which, np.arange(count + 1))
    seen = np.maximum.accumulate(np.maximum(src, dst)) + 1
    snapshots = []
    for t in range(count):
        lo, hi = bounds[t], bounds[t + 1]
        n = int(seen[hi - 1]) if hi > 0 else 0
        if n == 0:
            continue  # nothing has happened yet: no nodes
        s, d = src[lo:hi], dst[lo:hi]
        x = np.stack([np.bincount(s, minlength=n), np.bincount(d, minlength=n)], axis=1)
        snapshots.append(Snapshot(np.stack([s, d]), None, np.log1p(x).astype(np.float32), None, n))
    return SnapshotSequence(snapshots, name, growing=True)
