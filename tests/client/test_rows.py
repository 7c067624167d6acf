"""copy_rows (C++) against its numpy reference on fresh random inputs; bad rows and mismatched arrays refused."""

from __future__ import annotations

import numpy as np
import pytest

from distgnn.client.rows import copy_rows, copy_rows_reference


@pytest.mark.parametrize("dtype, row_shape", [(np.float32, (7,)), (np.int64, ()), (np.float16, (3, 5)), (bool, (4,))])
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("indexed", ["both", "src", "dst"])
def test_copy_rows_equals_the_numpy_reference(dtype, row_shape, threads, indexed):
    rng = np.random.default_rng()
    src = (rng.standard_normal((1000, *row_shape)) * 100).astype(dtype)
    n = int(rng.integers(1, 900))
    src_rows = rng.integers(0, 1000, n) if indexed in ("both", "src") else None
    dst_rows = rng.permutation(1200)[:n] if indexed in ("both", "dst") else None  # distinct places
    got = (rng.standard_normal((1200, *row_shape)) * 100).astype(dtype)
    want = got.copy()
    copy_rows(src, src_rows, got, dst_rows, threads)
    copy_rows_reference(src, src_rows, want, dst_rows)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "case, message",
    [
        ("src_row", r"src_rows\[1\] = 10 is out of range for 10 rows"),
        ("dst_row", r"dst_rows\[0\] = -1 is out of range"),
        ("lengths", "dst_rows has 2 entries, not 3"),
        ("dtype", "differ in dtype or row shape"),
        ("width", "differ in dtype or row shape"),
        ("short", "src has fewer rows than copied"),
    ],
)
def test_copy_rows_refuses_bad_input_and_writes_nothing(case, message):
    src, dst = np.arange(40, dtype=np.float32).reshape(10, 4), np.zeros((6, 4), np.float32)
    args = {
        "src_row": (src, np.array([0, 10]), dst, np.array([0, 1])),
        "dst_row": (src, np.array([0]), dst, np.array([-1])),
        "lengths": (src, np.array([0, 1, 2]), dst, np.array([0, 1])),
        "dtype": (src.astype(np.float64), None, dst, None),
        "width": (src[:, :3].copy(), None, dst, None),
        "short": (src[:2].copy(), None, dst, np.arange(3)),
    }[case]
    with pytest.raises(ValueError, match=message):
        copy_rows(*args)
    assert not dst.any()
