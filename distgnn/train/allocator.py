"""Memory settings of trainer processes: glibc malloc keeps freed memory for the next batch, and Python's
cyclic garbage collector runs at fixed steps of a training loop.

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

Python's collector runs whenever allocations outnumber frees by a threshold, at
any point of any step, and a full collection walks every object of the process
(with torch imported, a great many). Trainers that average gradients every step
wait for the slowest one, so a pause on one trainer stalls all of them. :class:`StepCollector`
freezes what exists when training starts (the modules, the model, the loader:
never walked again), turns automatic collection off during an epoch's steps and
collects the young generations itself every ``every`` steps: at the same step on
every trainer, over only what the recent steps left.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import logging

log = logging.getLogger(__name__)

# Steps between two collections of Python's young objects in a training loop (StepCollector).
GC_EVERY_STEPS = 50

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


@functools.cache
def _freeze_once() -> None:
    """Move every object alive now to the collector's permanent generation (once per process)."""
    gc.collect()
    gc.freeze()


class StepCollector:
    """Python's garbage collection for one epoch's steps (see the module's text).

    Use::

        collector = StepCollector(every=50)
        collector.start()                  # the first time in a process: collect once and freeze what exists
        for step in range(num_steps):
            ...
            collector.step_done()          # every ``every`` steps: collect the young generations
        collector.stop()                   # automatic collection as it was before start()

    Args:
        every: steps between two collections; 0 leaves the collector as it is (start and stop do nothing).
    """

    @classmethod
    def from_args(cls, args: object) -> StepCollector:
        """Every ``GC_EVERY_STEPS`` steps, or none with the job flag ``--no-gc-tuning``."""
        return cls(0 if getattr(args, "no_gc_tuning", False) else GC_EVERY_STEPS)

    def __init__(self, every: int) -> None:
        if every < 0:
            raise ValueError(f"StepCollector: every must be >= 0, got {every}")
        self.every = every
        self._steps = 0
        self._was_enabled: bool | None = None

    def start(self) -> None:
        if self.every == 0 or self._was_enabled is not None:
            return
        _freeze_once()
        self._was_enabled = gc.isenabled()
        gc.disable()
        self._steps = 0

    def step_done(self) -> None:
        if self._was_enabled is None:
            return
        self._steps += 1
        if self._steps % self.every == 0:
            gc.collect(1)

    def stop(self) -> None:
        """Safe to call twice, or without :meth:`start`."""
        if self._was_enabled is None:
            return
        if self._was_enabled:
            gc.enable()
        self._was_enabled = None
