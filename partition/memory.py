"""Each rank's peak memory in a distributed partition job, estimated from the chunked metadata alone.

The estimate counts the arrays a rank holds at its worst moment, per edge read, per edge written, per
owned node and per feature chunk (see ``partition.distributed`` for the phases), over a fixed base (the
interpreter with numpy and torch). The coefficients are bytes per item of those arrays; the benchmark
``benchmarks/partition_dist.py`` compares the estimate with the measured peak.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from distgnn.data.chunked import ChunkedLayout

# The interpreter with numpy, torch and gloo loaded.
BASE_BYTES = 330 << 20
# Peak bytes per edge this rank read (int64 ends, ids, types, the lookups' and the dispatch's copies).
PER_EDGE_READ = 120
# Peak bytes per edge this rank writes (the received rows, their sort, the CSC arrays).
PER_EDGE_WRITTEN = 96
# Peak bytes per owned node (assignment, new ids, their sorts and lookups).
PER_NODE_OWNED = 64
# One feature chunk as loaded, packed with its ids, sent and received.
FEATURE_CHUNK_COPIES = 4


@dataclass(frozen=True)
class RankEstimate:
    rank: int
    edges_read: int
    edges_written: int
    nodes_owned: int
    largest_feature_chunk: int
    peak_bytes: int


def estimate_ranks(layout: ChunkedLayout, workers: int, num_parts: int, method: str) -> list[RankEstimate]:
    """Per-rank peak memory of a ``workers``-rank job partitioning ``layout`` into ``num_parts``.

    Edges read and written follow the job's split (edge chunk ``j`` to rank ``j % W``; partition ``p`` to
    writer ``p % W``, its edges the average ``E / P``, which holds for random and range and for a
    balanced METIS assignment).
    """
    total_nodes = sum(layout.num_nodes.values())
    total_edges = sum(layout.num_edges(e) for e in layout.etypes)
    edges_read = np.zeros(workers, dtype=np.int64)
    for etype in layout.etypes:
        for j, rows in enumerate(layout.edge_chunks[etype]):
            edges_read[j % workers] += rows
    chunk_bytes = np.zeros(workers, dtype=np.int64)
    for arrays, chunks in [
        *((layout.ndata.get(t, {}), layout.node_chunks[t]) for t in layout.ntypes),
        *((layout.edata.get(e, {}), layout.edge_chunks[e]) for e in layout.etypes),
    ]:
        for array in arrays.values():
            row_bytes = int(np.prod(array.row_shape, dtype=np.int64)) * array.dtype.itemsize + 8
            for j, rows in enumerate(chunks):
                chunk_bytes[j % workers] = max(chunk_bytes[j % workers], rows * row_bytes)
    out = []
    for r in range(workers):
        parts = len(range(r, num_parts, workers))
        written = -(-total_edges * parts // max(num_parts, 1))
        owned = (r + 1) * total_nodes // workers - r * total_nodes // workers
        per_node = PER_NODE_OWNED * (3 if method == "metis" else 1)
        peak = (
            BASE_BYTES
            + PER_EDGE_READ * int(edges_read[r]) * (2 if method == "metis" else 1)
            + PER_EDGE_WRITTEN * written
            + per_node * owned
            + FEATURE_CHUNK_COPIES * int(chunk_bytes[r])
        )
        out.append(RankEstimate(r, int(edges_read[r]), int(written), int(owned), int(chunk_bytes[r]), int(peak)))
    return out


def available_bytes() -> int | None:
    """``MemAvailable`` of this machine (Linux), or None where it is unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def local_world_size() -> int:
    """Ranks on this machine (torchrun's ``LOCAL_WORLD_SIZE``; 1 when unset)."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1
