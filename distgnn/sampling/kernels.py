"""The C++ sampling kernels on numpy arrays, without torch: neighbour picks and parallel gathers on a CSC.

:func:`sample_neighbors` and :func:`take` run in the multi-threaded extension ``distgnn._cpu_kernels`` (see
:mod:`distgnn.native.cpu`); :mod:`distgnn.sampling.cpu` builds the sampler's layers and blocks on them. Nothing
here imports torch, so a graph server answers ``sample`` requests without loading it.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import numpy as np

from distgnn.native.cpu import extension


def sample_neighbors(
    indptr: np.ndarray,
    indices: np.ndarray,
    seeds: np.ndarray,
    fanout: int | np.ndarray,
    replace: bool = False,
    prob: np.ndarray | None = None,
    rng_seed: int = 0,
    num_threads: int | None = None,
    return_neighbors: bool = False,
) -> tuple[np.ndarray, ...]:
    """Pick up to ``fanout`` in-neighbours of each seed from a CSC graph.

    Without replacement a seed gets ``min(fanout, degree)`` distinct edges;
    with replacement ``fanout`` edges (none when its degree is 0); ``fanout=-1``
    takes every edge. With ``prob``, zero-weight edges are never picked and
    "degree" counts the non-zero-weight edges only; picks without replacement
    are successive weighted draws (as in DGL), with replacement independent
    draws proportional to weight.

    Args:
        indptr: ``(num_nodes + 1,)`` int64 CSC row pointer, ``indptr[-1] == len(indices)``.
        indices: ``(num_edges,)`` int32 or int64 source node of each edge position.
        seeds: ``(num_seeds,)`` integer node ids (``0 <= seed < num_nodes``), repeats allowed.
        fanout: picks per seed, ``-1`` for all; or a ``(num_seeds,)`` int64 array, one fanout per seed
            (typed sampling, where a "seed" is a row ``v * R + t`` of the typed CSC).
        replace: draw with replacement.
        prob: optional ``(num_edges,)`` float32 finite non-negative weight per edge position.
        rng_seed: seed of the random streams. Seed ``i`` draws from a stream
            keyed by ``(rng_seed, i)`` alone, so the result does not depend on
            ``num_threads``; pass a fresh ``rng_seed`` per call for fresh samples.
        num_threads: threads to use; ``None``: :func:`default_threads`.
        return_neighbors: also return ``indices[positions]`` as int64, gathered
            in parallel inside the kernel (faster than numpy's gather).

    Returns:
        ``counts``: ``(num_seeds,)`` int64 picks per seed, and ``positions``:
        ``(counts.sum(),)`` int64 positions into ``indices`` grouped by seed in
        seed order, so ``indices[positions]`` are the neighbours and
        ``eids[positions]`` the edge ids; with ``return_neighbors`` a third
        array, ``neighbors`` = ``indices[positions]`` (int64).

    Raises:
        ValueError: a dtype or shape is wrong, a seed is out of range, the
            ``indptr`` range of a seed is corrupt, or a weight is negative or not finite.
    """
    seeds = as_int64_ids(seeds, "seeds")
    fanouts = None
    if isinstance(fanout, np.ndarray):
        fanouts, fanout = np.ascontiguousarray(fanout, dtype=np.int64), 0
    elif not isinstance(fanout, (int, np.integer)) or fanout < -1:
        raise ValueError(f"fanout must be an int >= -1 (-1 = all neighbours) or an array, got {fanout!r}")
    return extension().sample_neighbors(
        indptr,
        indices,
        seeds,
        int(fanout),
        bool(replace),
        prob,
        int(rng_seed) % 2**64,
        _thread_count(num_threads),
        bool(return_neighbors),
        fanouts,
    )


def take(values: np.ndarray, positions: np.ndarray, num_threads: int | None = None) -> np.ndarray:
    """``values[positions]`` as int64, gathered in parallel (e.g. ``eids[positions]``, ``local2global[nbrs]``).

    Args:
        values: ``(n,)`` int32 or int64 array, read in place.
        positions: ``(m,)`` integer positions, ``0 <= p < n``.
        num_threads: as in :func:`sample_neighbors`.

    Returns:
        ``(m,)`` int64.

    Raises:
        ValueError: a dtype is wrong or a position is out of range.
    """
    positions = as_int64_ids(positions, "positions")
    return extension().take(values, positions, _thread_count(num_threads))


def default_threads() -> int:
    """The kernels' thread count when none is given: ``torch.get_num_threads()`` in a process that has loaded
    torch (so ``torch.set_num_threads(1)`` in a worker keeps them single-threaded); elsewhere (a graph server)
    ``OMP_NUM_THREADS`` where set, else torch's own default: the physical cores this process may run on."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch.get_num_threads()
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) >= 1:
        return int(env)
    return _physical_cores()


@functools.cache
def _physical_cores() -> int:
    """Distinct (package, core) pairs among the CPUs this process may run on (hyperthreads counted once)."""
    allowed = os.sched_getaffinity(0)
    cores = set()
    for cpu in allowed:
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add(((topology / "physical_package_id").read_text(), (topology / "core_id").read_text()))
        except OSError:
            return len(allowed)  # no topology to read (a container without /sys): every allowed CPU
    return max(1, len(cores))


def _thread_count(num_threads: int | None) -> int:
    if num_threads is None:
        return default_threads()
    if int(num_threads) < 1:
        raise ValueError(f"num_threads must be >= 1 or None, got {num_threads}")
    return int(num_threads)


def as_int64_ids(ids: np.ndarray, name: str) -> np.ndarray:
    """A 1-D contiguous int64 view (or copy) of an integer array (or CPU tensor); ValueError otherwise."""
    torch = sys.modules.get("torch")  # a tensor can only come from a process that has loaded torch
    if torch is not None and isinstance(ids, torch.Tensor):
        ids = ids.numpy()
    ids = np.asarray(ids)
    if ids.ndim != 1 or not (np.issubdtype(ids.dtype, np.integer) or ids.size == 0):
        raise ValueError(f"{name} must be a 1-D integer array, got dtype {ids.dtype} and shape {ids.shape}")
    return np.ascontiguousarray(ids, dtype=np.int64)
