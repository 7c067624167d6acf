"""glibc malloc settings for trainer processes: keep freed memory for the next batch.

A training step allocates the same large tensors every batch (a GraphSAGE
layer's output on a 1M-node graph is ~60 MB). glibc serves allocations above
its mmap threshold (at most 32 MiB) with fresh ``mmap`` pages and returns them
on ``free``, so every batch pays a page fault per 4 KiB of every large tensor:
in a CPU training step of ``benchmarks/train.py`` that was a large share of
the step. :func:`keep_freed_memory` makes malloc serve everything from its heap
and never trim it, so freed blocks are reused, already mapped. The process
keeps its peak heap for its lifetime; this suits trainers, whose peak is the
working set of a batch, not short-lived tools. It is what preloading jemalloc
or tcmalloc does for PyTorch on CPUs, without a preload.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4


@functools.cache
def keep_freed_memory() -> bool:
    """Tune glibc malloc of this process as described above; False (and nothing changed) where it is not glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        libc = None
    if libc is None or not hasattr(libc, "gnu_get_libc_version"):  # the settings below are glibc's
        log.info("not glibc: malloc settings left alone")
        return False
    mallopt = libc.mallopt
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    ok = mallopt(_M_MMAP_MAX, 0) == 1 and mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) == 1
    if not ok:
        log.warning("glibc rejected the malloc settings; freed memory goes back to the system as before")
    return ok
