"""The event stream and its time-sorted CSR in shared memory, built once per machine.

Every trainer of a temporal job needs the whole stream (src, dst, time, label, features) and its
:class:`~distgnn.temporal.graph.TemporalCSR`. Instead of each one reading and building its own, the first
trainer of a machine to claim the group (``distgnn.store.shm.claim``) reads the stream, builds the CSR, copies
both into the job's shared memory (segments ``distgnn-<job>-p<machine>-temporal.<array>``) and publishes a
manifest; the machine's other trainers wait for that manifest and map the same pages read-only, as trainers
map the static graph's partition. Nobody here removes the segments: the job's runner does at the end, also
after a failure or Ctrl-C (``distgnn.train.job.run_local``, ``distgnn-launch``'s sweep, local rank 0 in
``distgnn.launch.node``).

A trainer started without a job id (``DISTGNN_JOB_ID``: a plain torchrun) loads its own copy.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from distgnn.data.events import EventStream
from distgnn.errors import ConfigError, InputError, SharedMemoryError
from distgnn.launch import env as E
from distgnn.store import shm
from distgnn.temporal.graph import TemporalCSR, build_temporal_csr

log = logging.getLogger(__name__)

GROUP = "temporal"
STREAM_ARRAYS = ("src", "dst", "time", "label", "feat")
CSR_ARRAYS = ("indptr", "neighbors", "times", "eids")
# How long a trainer waits for the builder (alive) to publish: reading a 10M-event CSV takes about a minute.
WAIT_S = 900.0


@dataclass(frozen=True)
class MachineSlot:
    """Where this trainer's shared event graph lives: its job and its machine."""

    job_id: str
    machine: int

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> MachineSlot | None:
        """The slot the launcher's environment names (``DISTGNN_JOB_ID``, ``DISTGNN_MACHINE_ID`` or torchrun's
        ``GROUP_RANK``); None without a job id."""
        job_id = environ.get(E.JOB_ID)
        if not job_id:
            return None
        machine = environ.get(E.MACHINE_ID, environ.get("GROUP_RANK"))
        if machine is None or not machine.isdigit():
            raise ConfigError(
                f"{E.JOB_ID} is set but neither {E.MACHINE_ID} nor GROUP_RANK names this trainer's machine "
                f"(got {machine!r}); start trainers through distgnn-launch or --local"
            )
        return cls(job_id, int(machine))


@dataclass(frozen=True)
class SharedEventGraph:
    """A machine's event graph as this process mapped it.

    Attributes:
        events: the stream; its arrays are read-only views of shared memory.
        csr: its time-sorted CSR, read-only views of shared memory.
        built: whether this process built it (False: it attached to another trainer's).
    """

    events: EventStream
    csr: TemporalCSR
    built: bool


def machine_event_graph(
    slot: MachineSlot, key: str, load: Callable[[], EventStream], wait_s: float = WAIT_S
) -> SharedEventGraph:
    """This machine's shared event graph: built from ``load()`` by the first caller, mapped by the others.

    Args:
        slot: the job and machine.
        key: what the stream is (e.g. its ``--dataset`` spec, seed and ``--bipartite``); a trainer finding a
            graph published under another key raises instead of training on it.
        load: reads the stream (called by the builder only).
        wait_s: how long to wait for a live builder to publish.

    Raises:
        SharedMemoryError: the builder died before publishing, did not publish in ``wait_s``, published
            another stream, or a segment is missing or corrupt.
    """
    start = time.monotonic()
    built = shm.claim(slot.job_id, slot.machine, GROUP)
    if built:
        events = load()
        csr = build_temporal_csr(events)
        publish(slot, key, events, csr)
        del events, csr  # this process maps the shared copy from here on, as the others do
    graph = _wait_for(slot, wait_s)
    if graph is None:
        raise SharedMemoryError(
            f"the event graph of job {slot.job_id} machine {slot.machine} was removed from shared memory "
            f"({shm.segment_path(slot.job_id, slot.machine, GROUP + '.manifest')}) while this trainer started; "
            "start the job again"
        )
    meta, events, csr = graph
    if meta["key"] != key:
        raise SharedMemoryError(
            f"machine {slot.machine} of job {slot.job_id} holds the event graph of {meta['key']!r} in shared "
            f"memory, this trainer was started for {key!r}: give every trainer the same --dataset, --seed and "
            "--bipartite"
        )
    log.info(
        "event graph of machine %d: %s in shared memory (%d events, %d CSR entries, %.2f s)",
        slot.machine,
        "built" if built else "mapped",
        len(events),
        csr.num_entries,
        time.monotonic() - start,
    )
    return SharedEventGraph(events, csr, built)


def publish(slot: MachineSlot, key: str, events: EventStream, csr: TemporalCSR) -> None:
    """Copy ``events`` and ``csr`` into the machine's shared memory and publish them under ``key``."""
    arrays = {name: getattr(events, name) for name in STREAM_ARRAYS if getattr(events, name) is not None}
    arrays.update({f"csr_{name}": getattr(csr, name) for name in CSR_ARRAYS})
    meta = {"key": key, "num_nodes": events.num_nodes, "name": events.name}
    shm.publish_group(slot.job_id, slot.machine, GROUP, arrays, meta)


def attach(slot: MachineSlot) -> tuple[dict, EventStream, TemporalCSR] | None:
    """``(meta, events, csr)`` mapped read-only from the machine's shared memory; None before it is published.

    Raises:
        SharedMemoryError: a segment is missing or corrupt, or the arrays break the CSR's invariants (which the
            sampler's kernels rely on to stay in bounds).
    """
    group = shm.attach_group(slot.job_id, slot.machine, GROUP)
    if group is None:
        return None
    meta, arrays = group
    where = f"the event graph of job {slot.job_id} machine {slot.machine} in shared memory"
    missing = [n for n in ("src", "dst", "time", *(f"csr_{c}" for c in CSR_ARRAYS)) if n not in arrays]
    if missing:
        raise SharedMemoryError(f"{where} lacks arrays {missing}; start the job again")
    try:
        events = EventStream(
            arrays["src"],
            arrays["dst"],
            arrays["time"],
            int(meta["num_nodes"]),
            arrays.get("label"),
            arrays.get("feat"),
            str(meta.get("name", "")),
        )
    except (InputError, KeyError, TypeError, ValueError) as exc:  # the stream's own checks, a bad meta
        raise SharedMemoryError(f"{where} is not a valid event stream ({exc}); start the job again") from None
    csr = TemporalCSR(*(arrays[f"csr_{name}"] for name in CSR_ARRAYS))
    _check_csr(csr, events, where)
    return meta, events, csr


def _check_csr(csr: TemporalCSR, events: EventStream, where: str) -> None:
    n, m = events.num_nodes, csr.num_entries
    problem = None
    if csr.indptr.shape != (n + 1,) or csr.indptr.dtype != np.int64:
        problem = f"indptr is {csr.indptr.dtype}{list(csr.indptr.shape)}, expected int64[{n + 1}]"
    elif not (csr.times.shape == csr.eids.shape == (m,)):
        problem = f"neighbors/times/eids lengths differ: {m}, {csr.times.shape[0]}, {csr.eids.shape[0]}"
    elif csr.indptr[0] != 0 or csr.indptr[-1] != m or (n and np.diff(csr.indptr).min() < 0):
        problem = f"indptr does not rise from 0 to {m}"
    elif m and (csr.neighbors.min() < 0 or csr.neighbors.max() >= n):
        problem = f"a neighbour is outside [0, {n})"
    elif m and (csr.eids.min() < 0 or csr.eids.max() >= len(events)):
        problem = f"an event id is outside [0, {len(events)})"
    if problem:
        raise SharedMemoryError(f"{where} is corrupt: {problem}; start the job again")


def _wait_for(slot: MachineSlot, wait_s: float) -> tuple[dict, EventStream, TemporalCSR] | None:
    """The published graph, waiting while its builder lives; None if the claim itself is gone (swept)."""
    deadline = time.monotonic() + wait_s
    while True:
        graph = attach(slot)
        if graph is not None:
            return graph
        holder = shm.claim_holder(slot.job_id, slot.machine, GROUP)
        claim = shm.segment_path(slot.job_id, slot.machine, GROUP + ".claim")
        if holder is None and not claim.exists():
            return None
        if holder is not None and not shm.holder_alive(holder):
            raise SharedMemoryError(
                f"trainer pid {holder}, which was building the event graph of job {slot.job_id} machine "
                f"{slot.machine} in shared memory, exited before publishing it; see that trainer's log"
            )
        if time.monotonic() >= deadline:
            raise SharedMemoryError(
                f"trainer pid {holder} has not published the event graph of job {slot.job_id} machine "
                f"{slot.machine} after {wait_s:.0f} s; is it stuck reading the stream?"
            )
        time.sleep(0.05)


def host_tensor(array: np.ndarray) -> torch.Tensor:
    """A CPU tensor over ``array`` without a copy, also when it is a read-only shared-memory view (torch
    warns about those: it cannot mark a tensor read-only). Never write into the result."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)
