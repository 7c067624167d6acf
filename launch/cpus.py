"""The CPUs a process of a job may use on its machine: its affinity (a container's, Slurm's or ``taskset``'s
share, not every CPU of the host) shared out among the job's processes there (torchrun's ``LOCAL_WORLD_SIZE``)."""

from __future__ import annotations

import os


def local_world_size() -> int:
    """The job's processes on this machine (``LOCAL_WORLD_SIZE``; 1 when unset or not a number)."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def allowed_cpus() -> list[int]:
    """The CPUs this process may run on, sorted (every CPU where the platform has no affinity)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def cpus_each(processes: int) -> int:
    """How many of :func:`allowed_cpus` each of ``processes`` processes gets: at least one."""
    return max(1, len(allowed_cpus()) // max(processes, 1))


def cpu_share(local_rank: int, processes: int) -> list[int]:
    """Process ``local_rank``'s CPUs among ``processes``: its contiguous slice of :func:`allowed_cpus`, the
    remainder spread over the first slices; every CPU when there are fewer CPUs than processes.

    Raises:
        ValueError: ``local_rank`` is not in ``[0, processes)``.
    """
    cpus = allowed_cpus()
    processes = max(processes, 1)
    if not 0 <= local_rank < processes:
        raise ValueError(f"LOCAL_RANK {local_rank} is not below the machine's {processes} process(es)")
    if len(cpus) < processes:
        return cpus
    size, extra = divmod(len(cpus), processes)
    first = local_rank * size + min(local_rank, extra)
    return cpus[first : first + size + (local_rank < extra)]
