"""distgnn.server.optim: the adam_step update, C++ kernel against its numpy reference on fresh random inputs."""

from __future__ import annotations

import numpy as np
import pytest

from distgnn.errors import InputError
from distgnn.server import optim


def random_table(rng: np.random.Generator, num_rows: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    weight = rng.standard_normal((num_rows, dim), dtype=np.float32)
    state = np.zeros((num_rows, 2 * dim + 1), np.float32)
    state[:, : 2 * dim] = rng.random((num_rows, 2 * dim), dtype=np.float32) * 0.1
    state[:, 2 * dim] = rng.integers(0, 5, num_rows)  # rows touched a different number of times
    return weight, state


@pytest.mark.parametrize("dim", [1, 7, 64])
def test_the_kernel_matches_the_numpy_reference_over_several_steps(dim: int) -> None:
    rng = np.random.default_rng()
    weight, state = random_table(rng, 3000, dim)
    ref_weight, ref_state = weight.copy(), state.copy()
    for _ in range(3):
        ids = np.sort(rng.choice(len(weight), size=int(rng.integers(1, 2000)), replace=False))
        grad = rng.standard_normal((len(ids), dim), dtype=np.float32)
        optim.adam_rows(weight, state, ids, grad, 0.05, 0.9, 0.999, 1e-8)
        optim.adam_rows_reference(ref_weight, ref_state, ids, grad, 0.05, 0.9, 0.999, 1e-8)
    np.testing.assert_array_equal(state[:, 2 * dim], ref_state[:, 2 * dim])
    np.testing.assert_allclose(state, ref_state, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(weight, ref_weight, rtol=1e-5, atol=1e-6)


def test_unsorted_unique_ids_give_the_same_update_and_untouched_rows_stay() -> None:
    rng = np.random.default_rng()
    weight, state = random_table(rng, 500, 16)
    before = weight.copy()
    ids = rng.permutation(500)[:200]
    grad = rng.standard_normal((200, 16), dtype=np.float32)
    ref_weight, ref_state = weight.copy(), state.copy()
    optim.adam_rows(weight, state, ids, grad, 0.01, 0.8, 0.99, 1e-6)
    optim.adam_rows_reference(ref_weight, ref_state, ids, grad, 0.01, 0.8, 0.99, 1e-6)
    np.testing.assert_allclose(weight, ref_weight, rtol=1e-5, atol=1e-6)
    untouched = np.setdiff1d(np.arange(500), ids)
    np.testing.assert_array_equal(weight[untouched], before[untouched])


def test_repeated_or_out_of_range_ids_are_refused_before_any_write() -> None:
    rng = np.random.default_rng()
    weight, state = random_table(rng, 10, 4)
    before = weight.copy(), state.copy()
    grad = np.ones((3, 4), np.float32)
    with pytest.raises(InputError, match="unique"):
        optim.adam_rows(weight, state, np.array([3, 1, 3]), grad, 0.1, 0.9, 0.999, 1e-8)
    with pytest.raises(InputError, match=r"outside the table's rows \[0, 10\)"):
        optim.adam_rows(weight, state, np.array([0, 5, 10]), grad, 0.1, 0.9, 0.999, 1e-8)
    np.testing.assert_array_equal(weight, before[0])
    np.testing.assert_array_equal(state, before[1])


def test_a_repeated_id_is_refused_in_any_order() -> None:
    rng = np.random.default_rng()
    weight, state = random_table(rng, 100, 4)
    ids = rng.permutation(100)[:50]
    ids[rng.integers(1, 50)] = ids[0]
    with pytest.raises(InputError, match="appears twice"):
        optim.adam_rows(weight, state, ids, np.ones((50, 4), np.float32), 0.1, 0.9, 0.999, 1e-8)
