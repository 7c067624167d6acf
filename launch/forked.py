"""Ranks forked from this process: a job whose ranks all run on this host and share what this process imported.

A job of ranks that each would import the same large modules (torch) imports them once here and forks its
ranks after it: the import, most of a rank's start, is paid once for the job instead of once per rank.
:class:`ForkedRanks` forks ranks ``0 .. world - 1`` (each in its own process group, ``RANK`` and ``LOCAL_RANK``
set beside the given environment, SIGTERM when this process dies), watches them, and stops them all (through
:func:`~distgnn.launch.supervisor.stop_processes`) when one fails or this process gets SIGINT or SIGTERM.
Fork only before any thread of this process holds a lock a rank needs (no thread pools, no CUDA): a rank runs
a function of this process, not a fresh program. Standard library only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from distgnn.launch.supervisor import die_with_parent, stop_processes

# How often the watching process looks for a rank's exit.
WAIT_POLL_S = 0.02
# Exit code of a rank stopped by Ctrl-C, the shell's convention (128 + SIGINT).
INTERRUPTED_EXIT = 130

log = logging.getLogger(__name__)


class ForkedRanks:
    """Ranks ``0 .. world - 1`` of ``main`` (it returns the rank's exit code) in forked children; :meth:`run`
    returns the job's exit code. After it, ``failed`` is the rank whose non-zero exit stopped the job (None when
    none did) and ``signal_received`` the signal that stopped it (None when none did). ``grace_s``: how long the
    ranks get to exit after SIGTERM before SIGKILL; ``logger`` says the ranks' pids once all are forked."""

    def __init__(
        self, world: int, env: dict[str, str], main: Callable[[], int], grace_s: float, logger: logging.Logger = log
    ):
        self.world, self.env, self.main, self.grace_s, self.log = world, env, main, grace_s, logger
        self.children: dict[int, _Child] = {}  # rank -> child
        self.failed: int | None = None
        self.signal_received: int | None = None

    def _on_signal(self, signum, frame) -> None:
        self.signal_received = signum

    def _child(self, rank: int) -> None:
        """A rank's whole life in the forked child: it never returns into the caller's code."""
        code = 1
        try:
            os.setpgid(0, 0)  # a Ctrl-C at the terminal reaches the watching process, which stops ranks in order
            die_with_parent()
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_DFL)
            os.environ.update(self.env, RANK=str(rank), LOCAL_RANK=str(rank))
            code = self.main()
        except KeyboardInterrupt:
            code = INTERRUPTED_EXIT
        except BaseException as exc:
            print(f"error: rank {rank}: {exc!r}", file=sys.stderr)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def run(self) -> int:
        """Fork every rank and wait: 0 when all exit 0; else the failed rank's code (at least 1), or 128 + the
        signal received. Every rank has exited when it returns."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            for rank in range(self.world):
                if self.signal_received is not None:
                    break
                pid = os.fork()
                if pid == 0:
                    self._child(rank)
                self.children[rank] = _Child(pid)
            pids = " ".join(str(child.pid) for child in self.children.values())
            self.log.info("ranks 0-%d: pids %s", self.world - 1, pids)
            code = 0
            running = dict(self.children)
            while running and self.signal_received is None and self.failed is None:
                done = [rank for rank, child in running.items() if child.poll() is not None]
                if not done:
                    time.sleep(WAIT_POLL_S)
                for rank in done:
                    returncode = running.pop(rank).returncode
                    if returncode != 0 and self.failed is None:
                        self.failed, code = rank, returncode if returncode > 0 else 1
            if self.signal_received is not None:
                code = 128 + self.signal_received
            return code
        finally:
            stop_processes(list(self.children.values()), self.grace_s)
            for sig, handler in previous.items():
                signal.signal(sig, handler)


class _Child:
    """A forked child as :func:`~distgnn.launch.supervisor.stop_processes` handles a ``subprocess.Popen``."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout)
            time.sleep(WAIT_POLL_S)
        return self.returncode
