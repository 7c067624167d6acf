"""Row copies between arrays: ``dst[dst_rows] = src[src_rows]`` in one pass.

A :class:`~distgnn.client.tensor.DistTensor` read places its local rows and each server's reply at their positions in
the output. numpy does that in two passes (``take`` into a temporary, then a fancy-indexed assignment, the
slower of the two); :func:`copy_rows` copies each row once, in the C++ extension, on ``num_threads`` threads.
"""

from __future__ import annotations

import numpy as np
import torch

from distgnn.native.cpu import extension


def copy_rows(
    src: np.ndarray,
    src_rows: np.ndarray | None,
    dst: np.ndarray,
    dst_rows: np.ndarray | None,
    num_threads: int | None = None,
) -> None:
    """``dst[dst_rows[k]] = src[src_rows[k]]`` for every k (None: row k).

    Args:
        src, dst: C-contiguous arrays of one dtype and the same row shape (``shape[1:]``); ``dst`` writable.
        src_rows, dst_rows: int64 row numbers of equal length, or None.
        num_threads: threads to copy on (default: torch's intra-op count).

    Raises:
        ValueError: a row number out of range (nothing written), or arrays that do not match.
    """
    threads = torch.get_num_threads() if num_threads is None else num_threads
    extension().copy_rows(src, src_rows, dst, dst_rows, max(1, threads))


def copy_rows_reference(
    src: np.ndarray, src_rows: np.ndarray | None, dst: np.ndarray, dst_rows: np.ndarray | None
) -> None:
    """:func:`copy_rows` in numpy."""
    n = len(src_rows) if src_rows is not None else len(dst_rows) if dst_rows is not None else len(src)
    rows = src[src_rows] if src_rows is not None else src[:n]
    if dst_rows is None:
        dst[:n] = rows
    else:
        dst[dst_rows] = rows
