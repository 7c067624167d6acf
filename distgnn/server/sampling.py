"""Neighbour sampling on a partition's CSC, as the ``sample`` op runs it.

``sample_neighbors`` is the one switch point: the compiled kernel from
``distgnn.sampling.kernels`` when that module is present, else the vectorised
numpy version below (same contract: ``(counts, positions)`` grouped by seed in
seed order; deterministic for a given ``rng_seed``).
"""

from __future__ import annotations

import functools
import importlib

import numpy as np

from distgnn.errors import InputError


def _segments(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(starts[i], starts[i] + lengths[i])`` (int64)."""
    total = int(lengths.sum())
    offsets = np.cumsum(lengths) - lengths
    return np.repeat(starts - offsets, lengths) + np.arange(total, dtype=np.int64)


def numpy_sample_neighbors(
    indptr: np.ndarray,
    indices: np.ndarray,
    seeds: np.ndarray,
    fanout: int,
    replace: bool = False,
    prob: np.ndarray | None = None,
    rng_seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Pick up to ``fanout`` in-edges per seed (all with ``fanout=-1``); see the module docstring.

    Args:
        indptr: ``(N+1,)`` int64 CSC offsets; indices: ``(E,)`` neighbour ids (unused but kept
            for the kernel's signature).
        seeds: ``(S,)`` int64 local node ids.
        prob: optional ``(E,)`` non-negative edge weights; zero-weight edges are never picked.
    Returns:
        ``counts`` ``(S,)`` int64 and ``positions`` int64 into ``indices``.
    """
    rng = np.random.default_rng(rng_seed)
    seeds = np.asarray(seeds, dtype=np.int64)
    starts = indptr[seeds].astype(np.int64)
    degs = indptr[seeds + 1].astype(np.int64) - starts
    candidates = _segments(starts, degs)
    seg_of = np.repeat(np.arange(len(seeds), dtype=np.int64), degs)
    weights = None
    if prob is not None:
        weights = np.asarray(prob, dtype=np.float64)[candidates]
        usable = weights > 0
        candidates, seg_of, weights = candidates[usable], seg_of[usable], weights[usable]
        degs = np.bincount(seg_of, minlength=len(seeds)).astype(np.int64)
    if fanout < 0:
        return degs, candidates
    if replace:
        counts = np.where(degs > 0, fanout, 0).astype(np.int64)
        draw_seg = np.repeat(np.arange(len(seeds), dtype=np.int64), counts)
        seg_first = np.cumsum(degs) - degs
        u = rng.random(len(draw_seg))
        if weights is None:
            pick = seg_first[draw_seg] + np.minimum((u * degs[draw_seg]).astype(np.int64), degs[draw_seg] - 1)
        else:
            cum = np.cumsum(weights)
            cum0 = np.concatenate(([0.0], cum))
            before, totals = cum0[seg_first], cum0[seg_first + degs] - cum0[seg_first]
            target = before[draw_seg] + u * totals[draw_seg]
            pick = np.searchsorted(cum, target, side="right")
            pick = np.clip(pick, seg_first[draw_seg], seg_first[draw_seg] + degs[draw_seg] - 1)
        return counts, candidates[pick]
    counts = np.minimum(degs, fanout)
    keys = rng.random(len(candidates))
    if weights is not None:
        # Efraimidis-Spirakis: the k smallest -log(u)/w are a weighted sample without replacement.
        keys = -np.log1p(-keys) / weights
    order = np.lexsort((keys, seg_of))
    seg_first = np.cumsum(degs) - degs
    rank = np.arange(len(candidates), dtype=np.int64) - np.repeat(seg_first, degs)
    keep = rank < np.repeat(counts, degs)
    return counts, candidates[order][keep]


@functools.cache
def _kernel():
    try:
        return importlib.import_module("distgnn.sampling.kernels").sample_neighbors
    except ImportError:
        return numpy_sample_neighbors


def sample_neighbors(
    indptr: np.ndarray,
    indices: np.ndarray,
    seeds: np.ndarray,
    fanout: int,
    replace: bool,
    prob: np.ndarray | None,
    rng_seed: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Dispatch to the fastest available implementation (see the module docstring)."""
    if prob is not None and (prob.ndim != 1 or len(prob) != len(indices)):
        raise InputError(f"prob must be one weight per edge of the partition ({len(indices)},), got {prob.shape}")
    return _kernel()(indptr, indices, seeds, fanout, replace=replace, prob=prob, rng_seed=rng_seed)
