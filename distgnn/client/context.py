"""A trainer's connection to the job: configuration, RPC client, rank, local partition.

``initialize`` reads the launcher's environment once (through
``JobConfig.from_env``), checks that every machine's main server answers, and
keeps the result as the process's default context, which ``DistGraph``,
``DistTensor`` and ``node_split`` use unless given another one. There is no
other module-level state.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from distgnn.config import JobConfig
from distgnn.errors import ConfigError, InputError
from distgnn.rpc.client import RpcClient
from distgnn.store import shm

log = logging.getLogger(__name__)

# How long a trainer waits for its machine's main server to publish the partition.
PARTITION_WAIT_S = 60.0


@dataclass
class DistContext:
    """Everything trainer-side objects need; built by ``initialize``.

    Attributes:
        config: the job configuration (this trainer's machine is ``config.machine_id``).
        client: RPC client to every server.
        rank, world_size: this trainer's place among all trainers of the job.
        id_range_ends: per policy (``"node"``/``"edge"``), the ``(num_machines,)`` int64 end of each
            machine's id range, as the servers reported it when the context connected.
    """

    config: JobConfig
    client: RpcClient
    rank: int
    world_size: int
    id_range_ends: dict[str, np.ndarray] = field(repr=False)
    _partition: shm.SharedPartition | None = field(default=None, repr=False)

    @property
    def machine_id(self) -> int:
        return self.config.machine_id

    def local_partition(self) -> shm.SharedPartition:
        """This machine's partition, mapped read-only from shared memory on first use."""
        if self._partition is None:
            self._partition = shm.SharedPartition.attach(
                self.config.job_id, self.config.machine_id, writable=False, wait_s=PARTITION_WAIT_S
            )
        return self._partition

    def range_ends(self, policy: str) -> np.ndarray:
        """``(num_machines,)`` int64 end of each machine's node or edge id range, as its server reports.

        The owner of id ``i`` is ``searchsorted(ends, i, side="right")``.
        """
        if policy not in self.id_range_ends:
            raise InputError(f"partition policy must be one of {sorted(self.id_range_ends)}, got {policy!r}")
        return self.id_range_ends[policy]

    def read_server(self, machine_id: int) -> int:
        """The server of ``machine_id`` this trainer reads from: trainers are spread over all servers."""
        return (self.rank + machine_id) % self.config.num_servers

    def barrier(self, name: str = "default", timeout_s: float | None = None) -> None:
        """Return once every trainer of the job called ``barrier`` with the same name (this thread's pushes made
        without waiting are applied first, so every trainer sees them after the barrier)."""
        self.client.settle()
        self.client.call(0, "barrier", {"name": name, "parties": self.world_size}, timeout_s=timeout_s)

    def close(self) -> None:
        self.client.close()
        self._partition = None

    def __enter__(self) -> DistContext:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_default: DistContext | None = None


def initialize(
    ip_config: str | os.PathLike | None = None,
    part_config: str | os.PathLike | None = None,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    environ: Mapping[str, str] | None = None,
    **overrides,
) -> DistContext:
    """Join the job as a trainer and make the result the default context.

    Args:
        ip_config, part_config: override the launcher's ``DISTGNN_IP_CONFIG``/``DISTGNN_PART_CONFIG``.
        rank, world_size: default to torchrun's ``RANK``/``WORLD_SIZE``, else
            ``machine_id * num_trainers`` and ``num_machines * num_trainers``.
        environ: read instead of ``os.environ`` (tests).
        overrides: other ``JobConfig`` fields (``job_id``, ``token``, ``machine_id``, ``rpc_timeout_s``...).
    """
    global _default
    if _default is not None:
        raise ConfigError("distgnn is already initialized in this process; call distgnn.shutdown() first")
    environ = os.environ if environ is None else environ
    if ip_config is not None:
        overrides["ip_config"] = ip_config
    if part_config is not None:
        overrides["part_config"] = part_config
    config = JobConfig.from_env(environ, role="trainer", **overrides)
    if rank is None:
        rank = int(environ.get("RANK", config.machine_id * config.num_trainers))
    if world_size is None:
        world_size = int(environ.get("WORLD_SIZE", config.num_machines * config.num_trainers))
    _default = connect(config, rank, world_size)
    log.info("trainer %d/%d joined job %s on machine %d", rank, world_size, config.job_id, config.machine_id)
    return _default


def connect(config: JobConfig, rank: int = 0, world_size: int = 1) -> DistContext:
    """A context for ``config`` after every machine's main server answered (not made the default).

    ``initialize`` is the usual entry; this one serves processes that act for
    several machines at once (tests, benchmarks).
    """
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} out of range for world size {world_size}")
    client = RpcClient(config)
    try:
        replies = client.wait([client.send(m, "meta") for m in range(config.num_machines)])
    except BaseException:
        client.close()
        raise
    policies = set(shm.POLICIES).union(*(r.header.get("ranges", {}) for r in replies))
    ends = {
        policy: np.array(
            [(r.header.get("ranges") or {}).get(policy, r.header.get(f"{policy}_range"))[1] for r in replies],
            dtype=np.int64,
        )
        for policy in sorted(policies)
    }
    return DistContext(config, client, rank, world_size, ends)


def get_context() -> DistContext:
    """The context made by ``initialize``; raises ConfigError before that."""
    if _default is None:
        raise ConfigError("distgnn is not initialized: call distgnn.initialize() first")
    return _default


def shutdown() -> None:
    """Close this trainer's connections (the servers keep running; the launcher stops them)."""
    global _default
    if _default is not None:
        _default.close()
        _default = None
