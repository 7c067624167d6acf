"""How far the host's memory work scales with processes: the ceiling of any job on one host, threads or ranks.

The distributed partition job's steps are numpy passes over large arrays (copies, gathers by a permutation,
stable sorts) and buffered writes into the page cache. On one host every rank shares the memory system, so the
job cannot run more times faster than these passes do with as many processes. Per kind, ``k`` processes (one
thread each, started together behind a barrier) each run the same pass on arrays of their own (``copy`` and
``write`` 16 times, the others twice, times ``--repeats``); the table gives the passes' aggregate rate and
``speedup``: that rate over one process's.

* ``copy``: ``np.copyto`` of ``--mb`` MB (streaming reads and writes);
* ``gather``: ``np.take`` of int64 rows by a random permutation of ``--mb`` MB of them (a rank's renumbering and
  ordering by partition);
* ``sort``: a stable argsort of ``--mb`` / 8 MB of random int64 keys (more arithmetic a byte: the control that
  scales furthest with the cores);
* ``write``: ``os.pwrite`` of ``--mb`` MB into a new file under ``--dir`` (the page cache, as the partition's
  arrays are written), the file removed after each pass.

    python3 benchmarks/host_scaling.py [--procs 1,2,4,8,16] [--kinds copy,gather,sort,write] [--mb 256]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time
from pathlib import Path

import numpy as np


def _pass(kind: str, mb: int, repeats: int, directory: str, barrier, seed: int) -> float:
    rng = np.random.default_rng(seed)
    n = mb * (1 << 20) // 8
    if kind == "copy":
        src, dst = np.ones(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        work = lambda: np.copyto(dst, src)  # noqa: E731
    elif kind == "gather":
        table, order, out = np.arange(n, dtype=np.int64), rng.permutation(n), np.empty(n, dtype=np.int64)
        work = lambda: np.take(table, order, out=out)  # noqa: E731
    elif kind == "sort":
        keys = rng.integers(0, 1 << 40, n // 8)
        work = lambda: np.argsort(keys, kind="stable")  # noqa: E731
    elif kind == "write":
        data, path = np.ones(n, dtype=np.int64), Path(directory) / f"host_scaling.{os.getpid()}"

        def work() -> None:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                view, at = memoryview(data).cast("B"), 0
                while at < len(view):
                    at += os.pwrite(fd, view[at:], at)
            finally:
                os.close(fd)
                path.unlink()
    else:
        raise ValueError(f"unknown kind {kind!r}")
    work()  # pages touched, caches warm
    barrier.wait()
    start = time.perf_counter()
    for _ in range(repeats):
        work()
    return time.perf_counter() - start


PASSES = {"copy": 16, "gather": 2, "sort": 2, "write": 16}


def _worker(args: tuple) -> float:
    kind, mb, repeats, directory, seed = args
    repeats *= PASSES[kind]
    return _pass(kind, mb, repeats, directory, _BARRIER, seed)


def _init(barrier) -> None:
    global _BARRIER
    _BARRIER = barrier


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--procs", default="1,2,4,8,16", help="process counts, comma-separated")
    p.add_argument("--kinds", default="copy,gather,sort,write")
    p.add_argument("--mb", type=int, default=256, help="MB each process's pass works on")
    p.add_argument("--repeats", type=int, default=1, help="scales every kind's passes")
    p.add_argument("--dir", default="/tmp", help="where the write pass writes (the partition job's output disk)")
    args = p.parse_args()
    procs = [int(x) for x in args.procs.split(",")]
    print(f"host: {os.cpu_count()} CPUs, this process may run on {len(os.sched_getaffinity(0))}; {args.mb} MB a pass")
    print("kind | procs | s (slowest) | GB/s (all) | speedup")
    print("---|---|---|---|---")
    ctx = mp.get_context("fork")
    for kind in args.kinds.split(","):
        base = None
        for k in procs:
            barrier = ctx.Barrier(k)
            with ctx.Pool(k, initializer=_init, initargs=(barrier,)) as pool:
                seconds = pool.map(_worker, [(kind, args.mb, args.repeats, args.dir, i) for i in range(k)])
            slowest = max(seconds)
            rate = k * args.repeats * PASSES[kind] * args.mb / 1024 / slowest
            base = base or rate
            print(f"{kind} | {k} | {slowest:.2f} | {rate:.1f} | {rate / base:.2f}", flush=True)


if __name__ == "__main__":
    main()
