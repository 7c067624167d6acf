"""Shared memory of a job: plain ``.npy`` files in ``/dev/shm``, mapped with numpy.

Every segment is named ``distgnn-<job_id>-p<part_id>-<name>``, so several
simulated machines (and jobs) share one host without clashing, and everything a
job created can be found and removed by its prefix. Segments are written under
a temporary name and renamed into place, so a reader that sees a name sees the
complete array. The ``.npy`` header carries dtype and shape, so mapping needs
nothing else. (``multiprocessing.shared_memory`` is not used: its resource
tracker unlinks segments when the creating process exits.)

Names: ``graph.<array>`` (the partition's CSC and id map), ``<policy>.<tensor>``
(tensors partitioned over an id space: ``node``/``edge``, or per type
``node:<ntype>`` / ``edge:<src>:<rel>:<dst>``; owned rows only), and
``manifest`` (JSON, written last by the main server: the partition is loaded).
Array groups (:func:`publish_group`, :func:`attach_group`: ``<group>.<array>`` and
``<group>.manifest``) hold whole-machine arrays that one process builds and the
others map, e.g. the event graph of a temporal job (``temporal.*``); a claim
(:func:`claim`: ``<group>.claim``, holding the builder's pid) elects the builder.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from distgnn.errors import DistGNNError, InputError, SharedMemoryError

SHM_DIR = Path("/dev/shm")
POLICIES = ("node", "edge")
GRAPH_ARRAYS = ("indptr", "indices", "eids", "local2global")
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:\-]{0,127}$")
_JOB_ID = re.compile(r"^[A-Za-z0-9_\-]{1,64}$")


def check_name(name: object, what: str = "tensor name") -> str:
    """A name safe inside a file name: letters, digits, ``_ . : -``, at most 128 chars."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise InputError(f"{what} must match {_NAME.pattern} (letters, digits, '_.:-'), got {name!r}")
    return name


def job_prefix(job_id: str) -> str:
    if not _JOB_ID.match(job_id):
        raise InputError(f"job id must match {_JOB_ID.pattern}, got {job_id!r}")
    return f"distgnn-{job_id}-"


def segment_path(job_id: str, part_id: int, name: str) -> Path:
    return SHM_DIR / f"{job_prefix(job_id)}p{part_id}-{name}"


def job_segments(job_id: str, part_id: int | None = None) -> list[Path]:
    """Every segment of a job (or of one of its partitions) that exists now."""
    prefix = job_prefix(job_id) + (f"p{part_id}-" if part_id is not None else "")
    return sorted(p for p in SHM_DIR.iterdir() if p.name.startswith(prefix))


def remove_segments(job_id: str, part_id: int | None = None) -> int:
    """Unlink a job's segments (processes that mapped them keep their pages); returns the count."""
    removed = 0
    for path in job_segments(job_id, part_id):
        try:
            path.unlink()
            removed += 1
        except FileNotFoundError:
            pass
    return removed


def create_array(
    job_id: str,
    part_id: int,
    name: str,
    dtype: np.dtype | str,
    shape: tuple[int, ...],
    fill: Callable[[np.ndarray], None],
) -> np.ndarray:
    """Create segment ``name``, let ``fill`` write it, publish it; returns a writable map."""
    final = segment_path(job_id, part_id, name)
    tmp = final.with_name(f"{final.name}.tmp{os.getpid()}")
    try:
        arr = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.dtype(dtype), shape=tuple(shape))
        fill(arr)
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return arr


def attach_array(job_id: str, part_id: int, name: str, writable: bool) -> np.ndarray | None:
    """Map segment ``name`` (read-only unless ``writable``); None if it does not exist."""
    path = segment_path(job_id, part_id, name)
    try:
        arr = np.load(path, mmap_mode="r+" if writable else "r", allow_pickle=False)
    except FileNotFoundError:
        return None
    # A plain ndarray view (its base keeps the mapping alive): results of indexing it are plain arrays.
    return arr.view(np.ndarray)


def write_manifest(job_id: str, part_id: int, content: dict, name: str = "manifest") -> None:
    data = json.dumps(content).encode()
    create_array(job_id, part_id, name, np.uint8, (len(data),), lambda a: np.copyto(a, np.frombuffer(data, np.uint8)))


def read_manifest(job_id: str, part_id: int, wait_s: float = 0.0) -> dict:
    """The partition's manifest, waiting up to ``wait_s`` for the main server to publish it."""
    deadline = time.monotonic() + wait_s
    while True:
        arr = attach_array(job_id, part_id, "manifest", writable=False)
        if arr is not None:
            return json.loads(bytes(arr))
        if time.monotonic() >= deadline:
            raise DistGNNError(
                f"partition {part_id} of job {job_id} is not in shared memory "
                f"({segment_path(job_id, part_id, 'manifest')} missing after {wait_s}s); is its main server running?"
            )
        time.sleep(0.02)


@dataclass
class SharedPartition:
    """One machine's partition as mapped by a server or trainer.

    Attributes:
        job_id, part_id: which segments.
        writable: servers map read-write, trainers read-only.
        num_nodes, num_edges: of the whole graph.
        node_range, edge_range: the global ``[start, end)`` ids this partition owns.
        graph: ``indptr``/``indices``/``eids``/``local2global`` (see the format module).
        ranges: per id space (policy), the ``[start, end)`` ids owned here; ``totals``: its id count.
        typed: for a heterogeneous graph, ``ntypes``, ``etypes`` ("src:rel:dst"), ``node_type_ends``
            (end of each node type's owned range, relative to ``node_range[0]``), ``etype_dst``
            (node type id of each edge type's destination); empty for a homogeneous one.
        tensors: mapped tensors by ``(policy, name)``; others are mapped on first ``tensor`` call.
    """

    job_id: str
    part_id: int
    writable: bool
    num_nodes: int
    num_edges: int
    node_range: tuple[int, int]
    edge_range: tuple[int, int]
    graph: dict[str, np.ndarray]
    ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    totals: dict[str, int] = field(default_factory=dict)
    typed: dict = field(default_factory=dict)
    tensors: dict[tuple[str, str], np.ndarray] = field(default_factory=dict)

    @classmethod
    def attach(cls, job_id: str, part_id: int, writable: bool, wait_s: float = 0.0) -> SharedPartition:
        manifest = read_manifest(job_id, part_id, wait_s)
        graph = {}
        for name in GRAPH_ARRAYS:
            arr = attach_array(job_id, part_id, f"graph.{name}", writable=False)
            if arr is None:
                raise DistGNNError(f"partition {part_id} of job {job_id} lost its segment graph.{name}")
            graph[name] = arr
        return cls(
            job_id,
            part_id,
            writable,
            int(manifest["num_nodes"]),
            int(manifest["num_edges"]),
            tuple(manifest["node_range"]),
            tuple(manifest["edge_range"]),
            graph,
            {p: tuple(r) for p, r in manifest.get("ranges", {}).items()},
            dict(manifest.get("totals", {})),
            dict(manifest.get("typed", {})),
        )

    @property
    def num_etypes(self) -> int:
        return len(self.typed.get("etypes", ())) or 1

    def owned_range(self, policy: str) -> tuple[int, int]:
        """``[start, end)`` of the ids of id space ``policy`` that this partition owns."""
        if policy == "node":
            return self.node_range
        if policy == "edge":
            return self.edge_range
        if policy not in self.ranges:
            known = ["node", "edge", *(p for p in self.ranges if p not in POLICIES)]
            raise InputError(f"partition policy must be one of {known}, got {policy!r}")
        return self.ranges[policy]

    def total(self, policy: str) -> int:
        """Number of ids in id space ``policy`` (over all partitions)."""
        if policy == "node":
            return self.num_nodes
        if policy == "edge":
            return self.num_edges
        self.owned_range(policy)
        return int(self.totals[policy])

    def tensor(self, policy: str, name: str) -> np.ndarray | None:
        """The owned rows of tensor ``(policy, name)``, mapping it on first use; None if absent."""
        key = (policy, name)
        arr = self.tensors.get(key)
        if arr is None:
            self.owned_range(policy)
            arr = attach_array(self.job_id, self.part_id, f"{policy}.{check_name(name)}", self.writable)
            if arr is not None:
                self.tensors[key] = arr
        return arr


# -- array groups: built by one process of a machine, mapped by the others ----------------------------


def claim(job_id: str, part_id: int, group: str) -> bool:
    """Try to become the builder of ``group`` on this machine: True for exactly one caller (the first), which
    finds segment ``<group>.claim`` absent and creates it holding its pid."""
    path = segment_path(job_id, part_id, f"{check_name(group, 'group name')}.claim")
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(str(os.getpid()))
    return True


def claim_holder(job_id: str, part_id: int, group: str) -> int | None:
    """The pid in ``group``'s claim; None before the claimer wrote it (or without a claim)."""
    try:
        text = segment_path(job_id, part_id, f"{group}.claim").read_text()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None


def holder_alive(pid: int) -> bool:
    """Whether the process ``pid`` (a claim's holder) still exists on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, under another user
        return True
    return True


def publish_group(job_id: str, part_id: int, group: str, arrays: dict[str, np.ndarray], meta: dict) -> None:
    """Copy each of ``arrays`` into segment ``<group>.<name>``, then write ``<group>.manifest`` (``meta`` and
    every array's dtype and shape): a reader that sees the manifest sees every array complete. On failure the
    group's array segments written so far are removed (the claim stays: waiting readers see a dead builder)."""
    check_name(group, "group name")
    written = []
    try:
        for name, array in arrays.items():
            written.append(segment_path(job_id, part_id, f"{group}.{check_name(name, 'array name')}"))
            create_array(
                job_id, part_id, f"{group}.{name}", array.dtype, array.shape, lambda a, x=array: np.copyto(a, x)
            )
        listing = {name: {"dtype": array.dtype.str, "shape": list(array.shape)} for name, array in arrays.items()}
        write_manifest(job_id, part_id, {"meta": meta, "arrays": listing}, name=f"{group}.manifest")
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        raise


def attach_group(job_id: str, part_id: int, group: str) -> tuple[dict, dict[str, np.ndarray]] | None:
    """``(meta, arrays)`` of a published group, every array mapped read-only; None before it is published.

    Raises:
        SharedMemoryError: the manifest is unreadable, or an array it lists is missing, unreadable, or of
            another dtype or shape than listed.
    """
    manifest_path = segment_path(job_id, part_id, f"{group}.manifest")
    raw = _attach_checked(job_id, part_id, f"{group}.manifest")
    if raw is None:
        return None
    try:
        manifest = json.loads(bytes(raw))
        listing = {name: (np.dtype(a["dtype"]), tuple(a["shape"])) for name, a in manifest["arrays"].items()}
        meta = manifest["meta"]
    except (ValueError, KeyError, TypeError) as exc:
        raise SharedMemoryError(
            f"{manifest_path} is not a group manifest ({exc}); remove the job's segments "
            f"({job_prefix(job_id)}p{part_id}-*) and start the job again"
        ) from None
    arrays = {}
    for name, (dtype, shape) in listing.items():
        arr = _attach_checked(job_id, part_id, f"{group}.{name}")
        path = segment_path(job_id, part_id, f"{group}.{name}")
        if arr is None:
            raise SharedMemoryError(
                f"{path} is missing, though {manifest_path} lists it; was the job's shared memory swept "
                "while it ran? Start the job again"
            )
        if arr.dtype != dtype or arr.shape != shape:
            raise SharedMemoryError(
                f"{path} holds {arr.dtype}{list(arr.shape)}, its manifest says {dtype}{list(shape)}; "
                "start the job again"
            )
        arrays[name] = arr
    return meta, arrays


def _attach_checked(job_id: str, part_id: int, name: str) -> np.ndarray | None:
    """:func:`attach_array` read-only, with a truncated or corrupt segment raising SharedMemoryError."""
    try:
        return attach_array(job_id, part_id, name, writable=False)
    except (ValueError, OSError) as exc:
        raise SharedMemoryError(
            f"{segment_path(job_id, part_id, name)} is not a readable .npy segment ({exc}); "
            "it was truncated or overwritten: start the job again"
        ) from None
