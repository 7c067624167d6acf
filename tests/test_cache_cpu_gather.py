"""The C++ CPU row gather against torch.index_select (CPU, runs in CI)."""

from __future__ import annotations

import pytest
import torch

from distgnn.cache.cpu_gather import gather_rows_cpu
from distgnn.errors import InputError


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("width", [1, 3, 16, 100, 300])
@pytest.mark.parametrize("threads", [1, 3])
def test_matches_index_select_on_random_rows(dtype, width, threads):
    gen = torch.Generator().manual_seed(width * 7 + threads)
    for num_rows, n in ((1, 5), (97, 1000), (5000, 2049)):
        table = (torch.randn(num_rows, width, generator=gen) * 100).to(dtype)
        rows = torch.randint(0, num_rows, (n,), generator=gen)  # unsorted, with repeats
        out = torch.full((n, width), 7, dtype=dtype)
        assert gather_rows_cpu(table, rows, out, num_threads=threads) is out
        assert torch.equal(out, torch.index_select(table, 0, rows))


def test_writes_into_a_slice_of_a_larger_buffer():
    table = torch.randn(300, 8)
    buffer = torch.zeros(50, 8)
    rows = torch.randint(0, 300, (20,))
    gather_rows_cpu(table, rows, buffer[10:30])
    assert torch.equal(buffer[10:30], table[rows])
    assert not buffer[:10].any() and not buffer[30:].any()


def test_empty_positions_leave_out_alone():
    out = torch.empty(0, 4)
    assert gather_rows_cpu(torch.randn(5, 4), torch.empty(0, dtype=torch.int64), out) is out


@pytest.mark.parametrize("bad", [-1, 10])
def test_position_out_of_range_raises_index_error(bad):
    with pytest.raises(IndexError, match=f"row position {bad}"):
        gather_rows_cpu(torch.randn(10, 4), torch.tensor([0, bad, 1]), torch.empty(3, 4))


@pytest.mark.parametrize(
    ("table", "rows", "out", "match"),
    [
        (torch.randn(10, 4), torch.tensor([0, 1]), torch.empty(3, 4), "3 rows for 2"),
        (torch.randn(10, 4), torch.tensor([0, 1]), torch.empty(2, 5), "width"),
        (torch.randn(10, 4), torch.tensor([0, 1]), torch.empty(2, 4, dtype=torch.float16), "float16"),
        (torch.randn(10, 4), torch.tensor([0, 1], dtype=torch.int32), torch.empty(2, 4), "int64"),
        (torch.randn(4, 10).t(), torch.tensor([0, 1]), torch.empty(2, 4), "contiguous"),
        (torch.randn(10), torch.tensor([0, 1]), torch.empty(2, 4), "2-D"),
    ],
)
def test_bad_inputs_raise_input_error(table, rows, out, match):
    with pytest.raises(InputError, match=match):
        gather_rows_cpu(table, rows, out)
