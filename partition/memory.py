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
from distgnn.partition.distributed import edge_chunk_readers, read_term_bytes, table_dtype, uses_table

# The interpreter with numpy, torch and gloo loaded.
BASE_BYTES = 235 << 20
# The edge phase, in units of the id width (4 bytes where node and edge ids fit int32, else 8) and int64s: per edge
# read while its ends are renumbered and laid out by partition (both ends, the send rows, the order), ``READ_IDS`` ids
# and ``READ_INT64`` int64s (`read_term_bytes`, defined with the job, whose edge reading keeps within them); while a
# step is sent, the rank's rows and the rows received (one id per column each); per edge of the partition written,
# ``WRITE_IDS`` ids (the received rows, the sorted sources and original ids) and ``WRITE_INT64`` int64s (the sort key,
# the new edge ids), with the halo's table of ``HALO_PER_NODE`` bytes per node of the graph (or ``HALO_PER_ENTRY``
# bytes per edge where it sorts).
WRITE_IDS = 5
WRITE_INT64 = 2
HALO_PER_NODE = 5
HALO_PER_ENTRY = 33
# --method metis, while the multilevel partition is computed (before the edges are read for dispatch): per
# edge read, the symmetrised adjacency entries received (two per edge) and kept distinct; per owned node,
# the label propagation arrays and the lookups of the neighbours' labels; the scratch arrays of one block of
# entries; on rank 0, the coarsest graph gathered for METIS and METIS's copy of it, per adjacency entry.
PER_EDGE_READ_METIS = 36
PER_NODE_OWNED_METIS = 160
METIS_BLOCK_BYTES = 160 << 20
PER_COARSE_ENTRY = 96
# Per owned node (assignment, new ids, the features' new ids).
PER_NODE_OWNED = 32
# Copies of the largest feature chunk a rank holds: node data (a chunk as loaded, its rows in send order, the
# next chunk read ahead; received rounds are written as they arrive), edge data (as loaded, packed with its ids,
# sent and received, and the next one read ahead, with staging buffers where a chunk is larger than a round).
NODE_CHUNK_COPIES = 3
EDGE_CHUNK_COPIES = 5


@dataclass(frozen=True)
class RankEstimate:
    rank: int
    edges_read: int
    edges_per_part: int
    nodes_owned: int
    largest_feature_chunk: int
    peak_bytes: int


def estimate_ranks(
    layout: ChunkedLayout,
    workers: int,
    num_parts: int,
    method: str,
    coarse_edges: int = 50_000_000,
    renumber: str = "auto",
    message_mb: float = 256.0,
    base_bytes: int = BASE_BYTES,
) -> list[RankEstimate]:
    """Per-rank peak memory of a ``workers``-rank job partitioning ``layout`` into ``num_parts``.

    Edges read follow the job's split (:func:`~distgnn.partition.distributed.edge_chunk_readers`), and
    every rank holds the new-id table where the job uses it; a writer holds one partition's
    edges at a time, counted as the average ``E / P`` (random and range; a balanced METIS assignment is
    close to it). The peak is the largest of the edge phase, the feature phase and, for ``metis``, the
    multilevel phase (``coarse_edges``: the bound of the coarsest graph's adjacency entries, on rank 0),
    over ``base_bytes`` (a rank passes its own resident size at its start, with torch and gloo loaded;
    ``--dry-run`` uses ``BASE_BYTES``).
    """
    total_nodes = sum(layout.num_nodes.values())
    total_edges = sum(layout.num_edges(e) for e in layout.etypes)
    readers = edge_chunk_readers(layout, workers)
    edges_read = np.zeros(workers, dtype=np.int64)
    for etype in layout.etypes:
        np.add.at(edges_read, readers[etype], np.asarray(layout.edge_chunks[etype], dtype=np.int64))
    node_chunk = np.zeros(workers, dtype=np.int64)  # the largest chunk of node (edge) data each rank reads
    edge_chunk = np.zeros(workers, dtype=np.int64)
    for arrays, chunks, reader, largest in [
        *((layout.ndata.get(t, {}), layout.node_chunks[t], None, node_chunk) for t in layout.ntypes),
        *((layout.edata.get(e, {}), layout.edge_chunks[e], readers[e], edge_chunk) for e in layout.etypes),
    ]:
        for array in arrays.values():
            row_bytes = int(np.prod(array.row_shape, dtype=np.int64)) * array.dtype.itemsize + 8
            for j, rows in enumerate(chunks):
                r = j % workers if reader is None else int(reader[j])
                largest[r] = max(largest[r], rows * row_bytes)
    table = (
        table_dtype(total_nodes).itemsize * total_nodes
        if uses_table(renumber, total_nodes, total_edges, workers)
        else 0
    )
    largest_part = 0 if not num_parts else -(-total_edges // num_parts)
    id_bytes = table_dtype(max(total_nodes, total_edges, len(layout.etypes))).itemsize
    columns = 4 if len(layout.etypes) > 1 else 3
    halo = min(HALO_PER_NODE * total_nodes, HALO_PER_ENTRY * largest_part)
    message = max(1, int(message_mb * (1 << 20)))
    out = []
    for r in range(workers):
        owned = (r + 1) * total_nodes // workers - r * total_nodes // workers
        rows = columns * id_bytes * int(edges_read[r])
        # an exchange in several rounds stages one round's send and receive buffers
        per_peer = columns * id_bytes * -(-int(edges_read[r]) // max(num_parts, 1))
        staging = 2 * message if per_peer > message // workers else 0
        read = read_term_bytes(int(edges_read[r]), id_bytes, len(layout.etypes))
        send = rows + columns * id_bytes * largest_part + staging
        # the rank's rows are dropped before the last step's partition is written
        write = (rows if num_parts > workers else 0) + (WRITE_IDS * id_bytes + 8 * WRITE_INT64) * largest_part + halo
        edge_phase = max(read, send, write)
        feature_phase = max(
            NODE_CHUNK_COPIES * int(node_chunk[r]),
            # an edge data chunk larger than a round is exchanged in several, through staging buffers
            EDGE_CHUNK_COPIES * int(edge_chunk[r]) + (2 * message if edge_chunk[r] > message else 0),
        )
        metis_phase = 0
        if method == "metis":
            metis_phase = PER_EDGE_READ_METIS * int(edges_read[r]) + PER_NODE_OWNED_METIS * owned + METIS_BLOCK_BYTES
            if r == 0:
                metis_phase += PER_COARSE_ENTRY * min(int(coarse_edges), 2 * total_edges)
        peak = base_bytes + PER_NODE_OWNED * owned + max(edge_phase + table, feature_phase + table, metis_phase)
        chunk = int(max(node_chunk[r], edge_chunk[r]))
        out.append(RankEstimate(r, int(edges_read[r]), int(largest_part), int(owned), chunk, int(peak)))
    return out


def resident_bytes() -> int | None:
    """This process's resident memory now (Linux), or None where it is unknown."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
