"""Several trainers of one test in spawned processes (gloo on CPUs, NCCL on GPUs), and what each reports.

Each worker is ``target(rank, *args, out)`` and puts one ``(rank, result)`` on ``out``. :func:`run_ranks` starts
them, collects every rank's result and stops them all (at once when the test fails); a worker that dies before it
reports fails the test at once with its exit code instead of leaving the collector to wait out its deadline.
The standard library's spawn context: a process that imported torch has its tensor reductions registered there.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
from collections.abc import Callable


def run_ranks(
    target: Callable, args: tuple = (), world_size: int = 2, timeout_s: float = 120, clean_exit: bool = False
) -> dict[int, object]:
    """``{rank: result}`` of ``world_size`` spawned ``target(rank, *args, out)``.

    With ``clean_exit`` every worker must also exit with code 0 after it reported (its teardown, such as
    ``destroy_process_group``, succeeded).

    Raises:
        AssertionError: a worker exited before it reported (its exit code named), not every rank reported
            within ``timeout_s``, or (``clean_exit``) a worker exited with another code than 0.
    """
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(rank, *args, out)) for rank in range(world_size)]
    for proc in procs:
        proc.start()
    results: dict[int, object] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(results) < world_size:
            try:
                rank, result = out.get(timeout=1.0)
                results[rank] = result
                continue
            except queue.Empty:
                pass
            gone = [r for r, proc in enumerate(procs) if r not in results and proc.exitcode is not None]
            if gone:
                codes = ", ".join(f"rank {r} with code {procs[r].exitcode}" for r in gone)
                raise AssertionError(f"a worker exited before it reported: {codes}")
            if time.monotonic() > deadline:
                missing = sorted(set(range(world_size)) - set(results))
                raise AssertionError(f"ranks {missing} reported nothing within {timeout_s} s")
    finally:
        grace = 30 if len(results) == world_size else 1  # a failed run stops the others at once
        for proc in procs:
            proc.join(grace)
            if proc.is_alive():
                proc.kill()
                proc.join()
    codes = [proc.exitcode for proc in procs]
    assert not clean_exit or codes == [0] * world_size, f"exit codes of the ranks: {codes}"
    return results
