"""positions_by_owner: the positions of ids per owning machine of a range partition."""

from __future__ import annotations

import numpy as np
import pytest

from distgnn.client.tensor import positions_by_owner


@pytest.mark.parametrize("machines", [1, 2, 3, 8, 9, 20])
def test_positions_by_owner_equal_a_binary_search_of_the_range_ends(machines) -> None:
    # Few machines take a compare per range end, many a binary search; both equal searchsorted's owners, with
    # empty ranges among the machines and only the machines that own ids listed.
    rng = np.random.default_rng(machines)
    ends = np.sort(rng.integers(0, 10_000, machines))
    ends[-1] = 10_000
    if machines > 2:
        ends[1] = ends[0]  # an empty range
    ids = rng.integers(0, 10_000, 5000)
    got = positions_by_owner(ends, ids)
    owners = np.searchsorted(ends, ids, side="right")
    assert sorted(got) == np.unique(owners).tolist()
    for machine, positions in got.items():
        expected = np.flatnonzero(owners == machine)
        assert np.array_equal(np.arange(len(ids))[positions], expected)
    assert positions_by_owner(ends, np.zeros(0, np.int64)) == {}
