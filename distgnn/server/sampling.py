"""Neighbour sampling on a partition's CSC, as the ``sample`` op runs it.

``sample_neighbors`` is the one switch point: the compiled kernels of
``distgnn.sampling.kernels`` (same results as trainers sampling their local
seeds with them, for the same ``rng_seed``; neighbours and edge ids gathered
in parallel as the trainer does; no torch in the server), or, where the
extension cannot be built, the plain numpy reference
``distgnn.sampling.reference`` (correct, slower).
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from distgnn.errors import InputError
from distgnn.native.optional import OptionalExtension


def _load_sampling_kernels() -> ModuleType:
    # Imported on first use: a server that never samples does not load (or build) the extension.
    from distgnn.sampling import kernels

    kernels.extension()  # build or load now, so a broken toolchain falls back instead of failing each call
    return kernels


_kernels = OptionalExtension("the sample op's compiled kernel", _load_sampling_kernels, "the numpy reference")


def prepare() -> None:
    """Load the sampling kernel now (building it once if needed) instead of on the first request."""
    _kernels()


def sample_neighbors(
    graph: dict[str, np.ndarray],
    seeds: np.ndarray,
    fanout: int | np.ndarray,
    replace: bool,
    prob: np.ndarray | None,
    rng_seed: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sample in-neighbours of local ``seeds`` on a partition's ``graph`` arrays (see the format module).

    ``seeds`` are CSC rows (local node ids, or ``v * R + t`` items of a typed CSC) and ``fanout`` an int or
    one fanout per row.

    Returns ``counts`` int64 ``(len(seeds),)`` and, grouped by seed in seed order, the picked
    neighbours' global ids and the picked edges' global ids (int64); picks follow
    ``distgnn.sampling.kernels.sample_neighbors``. ``prob``: float32 weight per edge position, or None.
    """
    indptr, indices = graph["indptr"], graph["indices"]
    if prob is not None and prob.shape != indices.shape:
        raise InputError(f"prob must be one weight per edge of the partition ({len(indices)},), got {prob.shape}")
    kernels = _kernels()
    try:
        if kernels is None:
            from distgnn.sampling import reference

            counts, positions = reference.sample_neighbors(
                indptr, indices, seeds, fanout, replace=replace, prob=prob, rng_seed=rng_seed
            )
            return counts, graph["local2global"][indices[positions]], graph["eids"][positions]
        counts, positions, neighbours = kernels.sample_neighbors(
            indptr, indices, seeds, fanout, replace, prob, rng_seed, return_neighbors=True
        )
    except ValueError as exc:  # the kernel's input checks (negative weights, corrupt ranges)
        raise InputError(f"sampling failed: {exc}") from None
    return counts, kernels.take(graph["local2global"], neighbours), kernels.take(graph["eids"], positions)
