"""LocalCSC.eid_offset: edge ids of a partition numbered in CSC order are a position plus an offset."""

from __future__ import annotations

import numpy as np

from distgnn.sampling.cpu import sample_local
from distgnn.sampling.source import LocalCSC, SampleRequest, range_offset


def local_csc(eids: np.ndarray) -> LocalCSC:
    rng = np.random.default_rng(3)
    degrees = rng.integers(0, 6, 40)
    indptr = np.concatenate([[0], np.cumsum(degrees)]).astype(np.int64)
    indices = rng.integers(0, 60, int(indptr[-1])).astype(np.int64)
    eids = eids[: len(indices)]
    local2global = np.arange(100, 160, dtype=np.int64)
    return LocalCSC(0, 100, indptr, indices, eids, local2global, {}, eid_offset=range_offset(eids))


def test_edge_ids_in_csc_order_are_positions_plus_an_offset_and_sampling_gives_the_same_ids() -> None:
    in_order = local_csc(np.arange(500, 800, dtype=np.int64))
    shuffled = local_csc(np.random.default_rng(1).permutation(np.arange(500, 800, dtype=np.int64)))
    assert in_order.eid_offset == 500 and shuffled.eid_offset is None
    assert local_csc(np.array([3, 4, 6, 7] * 80, dtype=np.int64)).eid_offset is None  # ends 1 apart, not a range
    seeds = np.arange(100, 140, dtype=np.int64)
    for local in (in_order, shuffled):
        counts, src, eids = sample_local(local, SampleRequest(seeds, 3, False, None, rng_seed=9))
        # Each picked edge's id is the partition's id of its CSC position: its source is that position's.
        positions = np.searchsorted(local.eids, eids) if local.eid_offset is not None else None
        if positions is not None:
            assert np.array_equal(local.local2global[local.indices[positions]], src)
        else:
            lookup = {int(e): p for p, e in enumerate(local.eids)}
            assert np.array_equal(local.local2global[local.indices[[lookup[int(e)] for e in eids]]], src)
        assert counts.sum() == len(src) == len(eids)
