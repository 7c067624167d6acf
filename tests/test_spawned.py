"""The spawn-and-collect helper of the multi-process tests (tests/spawned.py): a worker that dies before it reports
fails the test at once, naming its exit code (results by rank: every test that uses it). The workers here import
no torch."""

from __future__ import annotations

import os
import time

import pytest
from spawned import run_ranks


def _rank_one_dies(rank: int, out) -> None:
    if rank == 1:
        os._exit(3)
    time.sleep(30)  # rank 0 would report only after the deadline


def test_a_worker_that_dies_fails_the_test_at_once() -> None:
    start = time.monotonic()
    with pytest.raises(AssertionError, match="rank 1 with code 3"):
        run_ranks(_rank_one_dies, timeout_s=60)
    assert time.monotonic() - start < 20  # neither the deadline nor rank 0's sleep: it is stopped


def _reports_then_exits_with_3(rank: int, out) -> None:
    out.put((rank, rank * 10))
    if rank == 1:
        out.close()
        out.join_thread()  # the report is in the pipe before the exit that skips the queue's own flush
        os._exit(3)


def test_a_worker_that_fails_after_reporting_fails_the_test_only_with_clean_exit() -> None:
    assert run_ranks(_reports_then_exits_with_3) == {0: 0, 1: 10}
    with pytest.raises(AssertionError, match=r"exit codes of the ranks: \[0, 3\]"):
        run_ranks(_reports_then_exits_with_3, clean_exit=True)
