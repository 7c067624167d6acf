"""The whole graph's structure in one trainer: every partition's CSC, read from the partition folder and joined
into one CSC over global node ids (:func:`replicated_csc`), so that a sampler samples every layer where it runs
and sends no ``sample`` request to another machine. Only the structure is replicated; features stay with their
owners (read through the feature path and its GPU cache).

Partitions own contiguous, ascending ranges of global ids (the partition format), so the joined CSC's row ``v``
(``v * R + t`` on a typed CSC with R edge types) is global node ``v``'s in-edges, in the same order as in the
partition that owns ``v``; its ``indices`` are global ids (int32 when the graph has fewer than 2^31 nodes) and
``local2global`` is the identity. Where the partitions number their edges in CSC order (a reshuffled partition
does), the edge ids are the range ``0 .. num_edges - 1`` and are not held (``eid_offset`` 0, ``eids`` empty).
The picks are uniform as on the partitioned path, from one random stream per layer instead of one per owner, so
the blocks differ from the partitioned run's for the same seed.

In a job the structure is joined once per machine (:func:`machine_structure`): the first trainer of the machine
that asks joins it and publishes it in the job's shared memory (segments ``distgnn-<job>-p<machine>-structure.*``,
removed with the machine's other segments), the machine's other trainers map it read-only.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from distgnn.errors import ConfigError, SharedMemoryError
from distgnn.partition.format import PartitionMeta, available_bytes, load_part_array
from distgnn.sampling.source import LocalCSC, range_offset
from distgnn.store import shm

log = logging.getLogger(__name__)

GROUP = "structure"  # the shared-memory group of a machine's joined structure
WAIT_S = 600.0  # how long a trainer waits for the machine's builder (alive) to publish it

# Edges converted from local to global ids per slice (bounds the int64 temporary to 64 MiB).
_EDGE_SLICE = 8 << 20


def structure_bytes(num_nodes: int, num_edges: int, num_etypes: int = 1, edge_ids: bool = True) -> int:
    """Bytes of the joined CSC in host memory: row offsets, global indices, the identity map, and the edge ids
    where they are held."""
    index_bytes = 4 if num_nodes < 2**31 else 8
    held = 8 * num_edges if edge_ids else 0
    return 8 * (num_nodes * num_etypes + 1) + index_bytes * num_edges + held + 8 * num_nodes


def replicated_csc(meta: PartitionMeta, part_id: int, num_etypes: int = 1, copies: int = 1) -> LocalCSC:
    """Every partition of ``meta`` joined into one :class:`LocalCSC` of the whole graph (``replicated=True``),
    named as partition ``part_id`` (this machine's); ``copies``: how many copies of it the caller will hold at
    once (2 where it is then copied into shared memory), for the memory check.

    Raises:
        ConfigError: the joined structure would not fit in the host's available memory (with its size and the
            memory available), or the partitions' node ranges do not tile ``[0, num_nodes)``.
        PartitionFormatError: a partition's file is missing or unreadable (every machine needs every
            partition's ``indptr``, ``indices``, ``eids`` and ``local2global``).
    """
    num_nodes, num_edges = meta.num_nodes, meta.num_edges
    ranges = np.asarray(meta.node_map, dtype=np.int64).reshape(-1, 2)
    order = np.argsort(ranges[:, 0], kind="stable")
    starts, ends = ranges[order, 0], ranges[order, 1]
    if starts[0] != 0 or ends[-1] != num_nodes or not np.array_equal(starts[1:], ends[:-1]):
        raise ConfigError(f"{meta.json_path}: partition node ranges {ranges.tolist()} do not tile [0, {num_nodes})")
    # Edge ids in CSC order across the partitions (in node order): the range 0 .. num_edges - 1, not held.
    contiguous, pos = True, 0
    for part in order.tolist():
        part_eids = load_part_array(meta, part, "eids")
        contiguous = contiguous and (len(part_eids) == 0 or range_offset(part_eids) == pos)
        pos += len(part_eids)
    needed = copies * structure_bytes(num_nodes, num_edges, num_etypes, edge_ids=not contiguous)
    available = available_bytes()
    if available is not None and needed > available:
        raise ConfigError(
            f"the replicated structure of {meta.graph_name!r} ({num_nodes} nodes, {num_edges} edges) needs "
            f"{needed / 2**30:.2f} GiB of host memory, {available / 2**30:.2f} GiB available; sample the "
            "partitioned structure instead (--structure partitioned)"
        )
    index_dtype = np.int32 if num_nodes < 2**31 else np.int64
    indptr = np.empty(num_nodes * num_etypes + 1, dtype=np.int64)
    indices = np.empty(num_edges, dtype=index_dtype)
    eids = np.empty(0 if contiguous else num_edges, dtype=np.int64)
    row = pos = 0
    for part in order.tolist():
        part_indptr = load_part_array(meta, part, "indptr")
        part_indices = load_part_array(meta, part, "indices")
        part_eids = load_part_array(meta, part, "eids")
        local2global = np.asarray(load_part_array(meta, part, "local2global"), dtype=np.int64)
        rows, edges = len(part_indptr) - 1, len(part_indices)
        expected_rows = int(ranges[part, 1] - ranges[part, 0]) * num_etypes
        if rows != expected_rows or pos + edges > num_edges:
            raise ConfigError(
                f"{meta.json_path}: partition {part} has {rows} CSC rows and {edges} edges, expected "
                f"{expected_rows} rows and at most {num_edges - pos} edges"
            )
        indptr[row : row + rows] = np.asarray(part_indptr[:-1]) - int(part_indptr[0]) + pos
        for start in range(0, edges, _EDGE_SLICE):
            stop = min(start + _EDGE_SLICE, edges)
            indices[pos + start : pos + stop] = local2global[np.asarray(part_indices[start:stop], dtype=np.int64)]
        if not contiguous:
            eids[pos : pos + edges] = part_eids
        row, pos = row + rows, pos + edges
    if row != len(indptr) - 1 or pos != num_edges:
        raise ConfigError(f"{meta.json_path}: the partitions hold {row} rows and {pos} edges, the graph {num_edges}")
    indptr[-1] = num_edges
    return LocalCSC(
        part_id=part_id,
        node_start=0,
        indptr=indptr,
        indices=indices,
        eids=eids,
        local2global=np.arange(num_nodes, dtype=np.int64),
        edge_weights={},
        num_etypes=num_etypes,
        eid_offset=0 if contiguous else None,
        replicated=True,
    )


def machine_structure(
    job_id: str, machine: int, meta: PartitionMeta, num_etypes: int = 1, wait_s: float = WAIT_S
) -> LocalCSC:
    """This machine's joined structure in the job's shared memory: joined and published by the first caller of
    the machine, mapped read-only by the others (and by the first from then on).

    Raises:
        ConfigError: as :func:`replicated_csc` (the first caller; it holds two copies while it publishes).
        SharedMemoryError: the builder died before publishing or did not publish within ``wait_s``, the
            machine's published structure is of another graph, or a segment is missing or corrupt.
    """
    key = f"{meta.json_path.resolve()}:{meta.num_nodes}:{meta.num_edges}:{num_etypes}"
    start = time.monotonic()
    built = shm.claim(job_id, machine, GROUP)
    if built:
        csc = replicated_csc(meta, machine, num_etypes, copies=2)
        arrays = {"indptr": csc.indptr, "indices": csc.indices}
        if csc.eid_offset is None:
            arrays["eids"] = csc.eids
        shm.publish_group(job_id, machine, GROUP, arrays, {"key": key, "eid_offset": csc.eid_offset})
        del csc, arrays  # this process maps the shared copy from here on, as the others do
    published, arrays = _wait_for(job_id, machine, wait_s)
    where = f"the joined structure of job {job_id} machine {machine} in shared memory"
    if published.get("key") != key:
        raise SharedMemoryError(f"{where} is of {published.get('key')!r}, this trainer's graph is {key!r}")
    indptr, indices = arrays.get("indptr"), arrays.get("indices")
    if indptr is None or indices is None or len(indptr) != meta.num_nodes * num_etypes + 1:
        raise SharedMemoryError(f"{where} lacks its row offsets or indices, or has the wrong number of rows")
    if len(indices) != meta.num_edges or int(indptr[0]) != 0 or int(indptr[-1]) != meta.num_edges:
        raise SharedMemoryError(f"{where} is corrupt: its indices or row offsets disagree with the graph's edges")
    eid_offset = published.get("eid_offset")
    log.info(
        "structure of all %d partitions %s in shared memory on machine %d (%.2f s)",
        meta.num_parts,
        "joined" if built else "mapped",
        machine,
        time.monotonic() - start,
    )
    return LocalCSC(
        part_id=machine,
        node_start=0,
        indptr=indptr,
        indices=indices,
        eids=arrays.get("eids", np.empty(0, dtype=np.int64)),
        local2global=np.arange(meta.num_nodes, dtype=np.int64),
        edge_weights={},
        num_etypes=num_etypes,
        eid_offset=None if eid_offset is None else int(eid_offset),
        replicated=True,
    )


def _wait_for(job_id: str, machine: int, wait_s: float) -> tuple[dict, dict[str, np.ndarray]]:
    """The published group, waiting while its builder lives."""
    deadline = time.monotonic() + wait_s
    while True:
        group = shm.attach_group(job_id, machine, GROUP)
        if group is not None:
            return group
        holder = shm.claim_holder(job_id, machine, GROUP)
        if holder is None and not shm.segment_path(job_id, machine, GROUP + ".claim").exists():
            raise SharedMemoryError(
                f"the joined structure of job {job_id} machine {machine} was removed from shared memory while this "
                "trainer waited for it; start the job again"
            )
        if holder is not None and not shm.holder_alive(holder):
            raise SharedMemoryError(
                f"trainer pid {holder}, which was joining the structure of job {job_id} machine {machine}, exited "
                "before publishing it; see that trainer's log"
            )
        if time.monotonic() >= deadline:
            raise SharedMemoryError(
                f"trainer pid {holder} has not published the joined structure of job {job_id} machine {machine} "
                f"after {wait_s:.0f} s"
            )
        time.sleep(0.05)
