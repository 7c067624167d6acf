"""``gather_rows_cpu``: ``out[i] = table[rows[i]]`` on CPU threads, for the host share of a GPU gather.

The C++ kernel (``csrc/cpu/rows.cpp``, in distgnn's CPU extension) copies whole rows with ``memcpy`` on the
sampler's thread pool and prefetches the rows of later items while copying, so the random reads of a large
feature table overlap; :func:`torch.index_select` is the reference it is tested against.
"""

from __future__ import annotations

import torch

from distgnn.errors import InputError
from distgnn.sampling import kernels


def gather_rows_cpu(
    table: torch.Tensor, rows: torch.Tensor, out: torch.Tensor, num_threads: int | None = None
) -> torch.Tensor:
    """Copies ``table[rows[i]]`` into ``out[i]`` and returns ``out``.

    Args:
        table: ``(R, F)`` CPU tensor with contiguous rows (any dtype; read in place, e.g. a shared-memory
            mapping).
        rows: ``(n,)`` int64 CPU positions into ``table``.
        out: ``(n, F)`` CPU tensor of ``table``'s dtype, contiguous (pinned memory for a later DMA).
        num_threads: threads to use (default: ``torch.get_num_threads()``).

    Raises:
        InputError: shapes, dtypes or devices disagree.
        IndexError: a position is outside ``[0, R)``.
    """
    for name, tensor in (("table", table), ("out", out)):
        if tensor.device.type != "cpu" or tensor.dim() != 2 or not tensor.is_contiguous():
            raise InputError(f"{name} must be a contiguous 2-D CPU tensor, got {tensor.dim()}-D on {tensor.device}")
    if out.dtype != table.dtype or out.shape[1] != table.shape[1]:
        raise InputError(f"out is {out.dtype} width {out.shape[1]} but table is {table.dtype} width {table.shape[1]}")
    if rows.dtype != torch.int64 or rows.dim() != 1 or rows.device.type != "cpu":
        raise InputError(f"rows must be a 1-D int64 CPU tensor, got {rows.dtype} {tuple(rows.shape)} on {rows.device}")
    if rows.shape[0] != out.shape[0]:
        raise InputError(f"out has {out.shape[0]} rows for {rows.shape[0]} positions")
    if rows.numel() == 0 or out.shape[1] == 0:
        return out
    kernels.extension().gather_rows(
        table.view(torch.uint8).numpy(),
        rows.contiguous().numpy(),
        out.view(torch.uint8).numpy(),
        kernels._thread_count(num_threads),
    )
    return out
