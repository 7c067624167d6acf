"""Neighbour sampling on a partition's CSC, as the ``sample`` op runs it.

``sample_neighbors`` is the one switch point: the compiled kernel of
``distgnn.sampling.kernels`` (same results as trainers sampling their local
seeds with it, for the same ``rng_seed``), or, where the extension cannot be
built, the plain numpy reference ``distgnn.sampling.reference`` (correct, slower).
"""

from __future__ import annotations

import functools
import logging

import numpy as np

from distgnn.errors import ExtensionBuildError, InputError

log = logging.getLogger(__name__)


@functools.cache
def _kernel():
    # Imported on first use: the kernels pull in torch, which a server that never samples does not need.
    from distgnn.sampling import kernels, reference

    try:
        kernels.extension()  # build or load now, so a broken toolchain falls back instead of failing each call
    except ExtensionBuildError as exc:
        log.warning("compiled sampling kernel unavailable (%s); the sample op uses the numpy reference", exc)
        return reference.sample_neighbors
    return kernels.sample_neighbors


def prepare() -> None:
    """Load the sampling kernel now (building it once if needed) instead of on the first request."""
    _kernel()


def sample_neighbors(
    indptr: np.ndarray,
    indices: np.ndarray,
    seeds: np.ndarray,
    fanout: int,
    replace: bool,
    prob: np.ndarray | None,
    rng_seed: int,
) -> tuple[np.ndarray, np.ndarray]:
    """``(counts, positions)`` for local ``seeds`` (see ``distgnn.sampling.kernels.sample_neighbors``)."""
    if prob is not None:
        if prob.ndim != 1 or len(prob) != len(indices):
            raise InputError(f"prob must be one weight per edge of the partition ({len(indices)},), got {prob.shape}")
        prob = prob.astype(np.float32, copy=False)
    try:
        return _kernel()(indptr, indices, seeds, fanout, replace=replace, prob=prob, rng_seed=rng_seed)
    except ValueError as exc:  # the kernel's input checks (negative weights, corrupt ranges)
        raise InputError(f"sampling failed: {exc}") from None
