"""Filling shared memory: the main server copies its partition from disk, and creates tensors.

Loading is one sequential copy per array (``np.load`` memory-maps the file,
``np.copyto`` writes the segment), so it runs at disk read speed with no
per-row Python work. Backups and trainers only map what the main server wrote
(``distgnn.store.shm.SharedPartition.attach``).
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np

from distgnn.errors import InputError, PartitionFormatError
from distgnn.partition.format import (
    PartitionMeta,
    feature_policy,
    load_edge_feature,
    load_node_feature,
    load_part_array,
)
from distgnn.store import shm

log = logging.getLogger(__name__)

INIT_KINDS = ("zeros", "ones", "uniform", "normal")
# Random initial values are drawn (as float64) in blocks of about this many bytes.
_FILL_BLOCK_BYTES = 64 << 20


def _copy_segment(job_id: str, part_id: int, name: str, src: np.ndarray) -> None:
    shm.create_array(job_id, part_id, name, src.dtype, src.shape, lambda dst: np.copyto(dst, src))


def load_partition(job_id: str, part_id: int, meta: PartitionMeta) -> shm.SharedPartition:
    """Copy partition ``part_id`` into shared memory (removing stale segments of this job first)."""
    start = time.monotonic()
    stale = shm.remove_segments(job_id, part_id)
    if stale:
        log.warning("removed %d stale shared-memory segments of job %s partition %d", stale, job_id, part_id)
    part = meta.parts[part_id]
    book = meta.partition_book()
    ranges = book.policy_ranges(part_id)
    for name in shm.GRAPH_ARRAYS:
        _copy_segment(job_id, part_id, f"graph.{name}", load_part_array(meta, part_id, name))
    for kind, keys, loader in (
        ("node", part.node_feats, load_node_feature),
        ("edge", part.edge_feats, load_edge_feature),
    ):
        for key in keys:
            policy, name = feature_policy(key, kind)
            first, end = ranges[policy]
            arr = loader(meta, part_id, key)
            if arr.ndim == 0 or arr.shape[0] != end - first:
                raise PartitionFormatError(
                    f"partition {part_id}: {kind} feature {key!r} has shape {arr.shape}, expected {end - first} rows"
                )
            _copy_segment(job_id, part_id, f"{policy}.{shm.check_name(name, 'feature name')}", arr)
    typed = {}
    if not book.is_homogeneous:
        node_start = meta.node_map[part_id][0]
        typed = {
            "ntypes": book.ntypes,
            "etypes": meta.etypes,
            "node_type_ends": [int(e) - node_start for _, e in meta.node_type_ranges[part_id]],
            "etype_dst": book.etype_dst.tolist(),
        }
    shm.write_manifest(
        job_id,
        part_id,
        {
            "graph_name": meta.graph_name,
            "num_nodes": meta.num_nodes,
            "num_edges": meta.num_edges,
            "node_range": meta.node_map[part_id],
            "edge_range": meta.edge_map[part_id],
            "ranges": {p: list(r) for p, r in ranges.items()},
            "totals": book.policy_totals(),
            "typed": typed,
        },
    )
    log.info(
        "loaded partition %d of %s into shared memory in %.2fs", part_id, meta.graph_name, time.monotonic() - start
    )
    return shm.SharedPartition.attach(job_id, part_id, writable=True)


def create_tensor(
    partition: shm.SharedPartition,
    policy: str,
    name: str,
    dtype: str,
    shape: tuple[int, ...],
    init: str,
    low: float,
    high: float,
    seed: int,
) -> np.ndarray:
    """Create this partition's rows of tensor ``(policy, name)`` with global ``shape``, or map it
    if it exists with the same dtype and row shape (several trainers create the same tensor)."""
    start, end = partition.owned_range(policy)
    total = partition.total(policy)
    if init not in INIT_KINDS:
        raise InputError(f"init must be one of {INIT_KINDS}, got {init!r}")
    if not shape or shape[0] != total:
        raise InputError(f"a {policy} tensor needs {total} rows (one per {policy} of the graph), got shape {shape}")
    rows_shape = (end - start, *shape[1:])
    existing = partition.tensor(policy, name)
    if existing is not None:
        if existing.dtype != np.dtype(dtype) or existing.shape != rows_shape:
            raise InputError(
                f"{policy} tensor {name!r} exists with dtype {existing.dtype} and local shape {existing.shape}; "
                f"requested {dtype} {rows_shape}"
            )
        return existing
    rng = np.random.default_rng([seed, partition.part_id])

    def fill(arr: np.ndarray) -> None:
        if init == "zeros":
            arr.fill(0)
        elif init == "ones":
            arr.fill(1)
        else:
            draw = rng.uniform if init == "uniform" else rng.normal
            # Block by block: one draw for the whole table would hold a float64 copy of all of it.
            block = max(1, _FILL_BLOCK_BYTES // (8 * max(1, math.prod(arr.shape[1:]))))
            for begin in range(0, len(arr), block):
                rows = arr[begin : begin + block]
                rows[...] = draw(low, high, size=rows.shape)

    shm.create_array(partition.job_id, partition.part_id, f"{policy}.{shm.check_name(name)}", dtype, rows_shape, fill)
    return partition.tensor(policy, name)
