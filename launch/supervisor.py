"""Runs a launch plan: starts every process, streams their output, and tears the job down.

Each process runs under the wrapper of ``remote.py`` on its machine, reached
through a transport (ssh or local). Output lines come back prefixed with
``[machine/role/rank]``, and every line is also kept in ``log_dir``, one file per
label. The job succeeds when every trainer exits 0 (servers
then get a grace period to exit on their own). Any other exit with a non-zero
status, a lost ssh connection, SIGINT or SIGTERM stops the job: stdin of every
wrapper is closed (each stops its process tree), stragglers are killed, and a
sweep on every machine kills whatever still carries the job id and removes the
job's shared memory. A failure is reported by ``failure.py``: first one line
naming the process that died first, then one line for all the others.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import functools
import json
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TextIO

from distgnn.launch import env as E
from distgnn.launch.failure import (
    SIGNAL_PRECEDENCE_S,
    ProcessExit,
    returncode_of_status,
    root_cause,
    root_cause_line,
    summary_line,
)
from distgnn.launch.plan import ProcessSpec, wrapper_argv
from distgnn.launch.remote import EXIT_REPORT
from distgnn.launch.transport import SSH_FAILED, run_short

TAIL_LINES = 200
REPORT_LINES = 25
SERVER_EXIT_GRACE_S = 2.0
_TEE_PREFIX = re.compile(r"^\[default(\d+)\]:(.*)$", re.DOTALL)
_ROOT_CAUSE_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_ROOT_CAUSE_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)")
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """``preexec_fn`` of a child that must not outlive the thread that starts it: in the child before exec, asks
    the kernel to send it SIGTERM when that thread ends, even when the parent is killed outright (SIGKILL)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def stop_processes(procs: list[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM to each of ``procs`` still running; after ``grace_s`` (for all together), SIGKILL to those left.
    Returns once every one has exited."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class Running:
    """A started process of the plan and what the launcher knows about it."""

    spec: ProcessSpec
    popen: subprocess.Popen
    readers: list[threading.Thread] = field(default_factory=list)
    returncode: int | None = None
    observed_at: float | None = None  # time.monotonic() when its exit was seen
    exit_report: dict | None = None  # the wrapper's EXIT_REPORT


class Job:
    """One run of a plan. ``run()`` returns the launcher's exit status.

    ``log_dir``: where every label's output is kept in full (``log_name(label)``, by default
    ``<machine>-<role>-<rank>.log``); None keeps none. ``name`` starts the job's own lines (none if empty);
    ``labelled``: each output line comes prefixed with ``[label]`` (unlabelled, the failed process's last lines
    are not repeated in the report: they are on the console as they came); ``server_exit_grace_s``: how long
    servers may take to exit on their own after the trainers (then they are stopped); ``quiet_roles``: roles
    whose output goes only to the logs.
    """

    def __init__(
        self,
        plan: list[ProcessSpec],
        transport,
        python: str,
        token: str,
        num_trainers: int,
        grace_s: float = 5.0,
        out: TextIO = sys.stdout,
        err: TextIO = sys.stderr,
        log_dir: str | Path | None = None,
        *,
        name: str = "distgnn-launch",
        labelled: bool = True,
        log_name: Callable[[str], str] | None = None,
        server_exit_grace_s: float = SERVER_EXIT_GRACE_S,
        quiet_roles: tuple[str, ...] = (),
    ) -> None:
        self.plan = plan
        self.transport = transport
        self.python = python
        self.token = token
        self.num_trainers = num_trainers
        self.grace_s = grace_s
        self.out, self.err = out, err
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.name, self.labelled, self.server_exit_grace_s = name, labelled, server_exit_grace_s
        self.quiet_roles = quiet_roles
        self.log_name = log_name or (lambda label: f"{label.replace('/', '-')}.log")
        self.job_id = plan[0].env[E.JOB_ID]
        self.running: list[Running] = []
        self.events: queue.Queue[Running] = queue.Queue()
        self.tails: dict[str, collections.deque[str]] = collections.defaultdict(
            lambda: collections.deque(maxlen=TAIL_LINES)
        )
        self.last_stderr: dict[str, str] = {}
        self.logs: dict[str, IO[str]] = {}
        self.print_lock = threading.Lock()
        self.signal_received: int | None = None
        self.teardown_started: float | None = None
        #: The process that failed first (set when the job failed), as the report named it.
        self.cause: ProcessExit | None = None
        # While a failed or interrupted job is torn down, the others' dying words (torchrun's
        # SignalException tracebacks) are kept in the tails and logs but not echoed.
        self.echo = True

    # -- output ---------------------------------------------------------------------------------

    def say(self, message: str) -> None:
        with self.print_lock:
            self.err.write(f"{self.name}: {message}\n" if self.name else f"{message}\n")
            self.err.flush()

    def _log(self, label: str, line: str) -> None:
        """Append to the label's log file (caller holds ``print_lock``)."""
        if self.log_dir is None:
            return
        log = self.logs.get(label)
        if log is None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            log = self.logs[label] = open(self.log_dir / self.log_name(label), "a")  # noqa: SIM115
        log.write(line + "\n")
        log.flush()

    def _pump(self, proc: Running, stream, sink: TextIO) -> None:
        spec = proc.spec
        is_stderr = sink is self.err
        show = None if self.labelled or spec.role in self.quiet_roles else functools.partial(self._show, sink)
        for raw in _lines(stream, show):
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if is_stderr and line.startswith(EXIT_REPORT):
                with contextlib.suppress(json.JSONDecodeError):
                    proc.exit_report = json.loads(line[len(EXIT_REPORT) :])
                continue
            label = spec.label
            tee = _TEE_PREFIX.match(line) if spec.is_agent else None
            if tee:
                rank = spec.machine_id * self.num_trainers + int(tee.group(1))
                label, line = f"{spec.machine_id}/trainer/{rank}", tee.group(2)
            self.tails[label].append(line)
            with self.print_lock:
                if is_stderr and line.strip():
                    self.last_stderr[label] = line
                self._log(label, line)
                if self.echo and spec.role not in self.quiet_roles:
                    sink.write(f"[{label}] {line}\n" if self.labelled else f"{_unshown(raw)}\n")
                    sink.flush()
        stream.close()

    def _show(self, sink: TextIO, text: bytes) -> None:
        """Echo the start of a line that is still being written (a progress bar redrawn after ``\\r``)."""
        with self.print_lock:
            if self.echo:
                sink.write(text.decode("utf-8", "replace"))
                sink.flush()

    # -- processes ------------------------------------------------------------------------------

    def _start(self, spec: ProcessSpec) -> None:
        cmd = self.transport.command(spec.host, wrapper_argv(spec, self.python, self.grace_s), spec.env)
        popen = subprocess.Popen(
            cmd.argv,
            env=cmd.env,
            cwd=cmd.cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # a Ctrl-C at the terminal reaches the launcher only; it stops the rest in order
        )
        proc = Running(spec, popen)
        # A process that died at once (ssh refused) closed its stdin; its exit status tells the story.
        with contextlib.suppress(BrokenPipeError):
            popen.stdin.write(f"{self.token}\n".encode())
            popen.stdin.flush()
        for stream, sink in ((popen.stdout, self.out), (popen.stderr, self.err)):
            reader = threading.Thread(target=self._pump, args=(proc, stream, sink), daemon=True)
            reader.start()
            proc.readers.append(reader)

        def wait():
            returncode = popen.wait()
            proc.observed_at = time.monotonic()
            proc.returncode = returncode
            self.events.put(proc)

        threading.Thread(target=wait, daemon=True).start()
        self.running.append(proc)

    def _on_signal(self, signum, frame) -> None:
        self.signal_received = signum

    def run(self) -> int:
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            return self._run()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for log in self.logs.values():
                log.close()

    def _run(self) -> int:
        failed: Running | None = None
        try:
            for spec in self.plan:  # servers first, then trainers
                if self.signal_received is not None:
                    break
                self._start(spec)
            trainers_left = sum(1 for spec in self.plan if spec.role == "trainer")
            while trainers_left and self.signal_received is None and len(self.running) == len(self.plan):
                try:
                    proc = self.events.get(timeout=0.1)
                except queue.Empty:
                    continue
                if proc.returncode != 0:
                    failed = proc
                    break
                if proc.spec.role == "trainer":
                    trainers_left -= 1
            if failed is None and self.signal_received is None and not trainers_left:
                failed = self._let_servers_finish()
        except BaseException:
            self._teardown()
            raise
        if self.signal_received is not None:
            self.say(f"received {signal.Signals(self.signal_received).name}; stopping job {self.job_id}")
        elif failed is not None:
            self.cause = self._find_root_cause(failed)
            self.say(root_cause_line(self.cause))
            self.say(f"stopping job {self.job_id} on every machine")
        if self.signal_received is not None or failed is not None:
            self.echo = False
        self._teardown()
        if self.signal_received is not None:
            self.say(f"job {self.job_id} stopped on every machine")
            return 128 + self.signal_received
        if self.cause is not None:
            others = [e for e in self._exits() if _key(e) != _key(self.cause) and (e.failed or e.stopped)]
            self.say(summary_line(others, self.log_dir))
            if self.labelled:
                self._report(self.cause)
            return 1
        self.say(f"job {self.job_id} finished")
        return 0

    def _let_servers_finish(self) -> Running | None:
        """Trainers are done: servers that exit on their own get a moment, the rest are stopped. Returns a failed server."""
        deadline = time.monotonic() + self.server_exit_grace_s
        while time.monotonic() < deadline and self.signal_received is None:
            if all(p.returncode is not None for p in self.running):
                break
            try:
                proc = self.events.get(timeout=0.1)
            except queue.Empty:
                continue
            if proc.returncode != 0:
                return proc
        if any(p.returncode is None for p in self.running) and self.signal_received is None:
            self.say("trainers finished; stopping the servers")
        return None

    # -- failure report -------------------------------------------------------------------------

    def _find_root_cause(self, failed: Running) -> ProcessExit:
        """The first failure; a death by signal seen within ``SIGNAL_PRECEDENCE_S`` of it wins."""
        deadline = (failed.observed_at or time.monotonic()) + SIGNAL_PRECEDENCE_S
        while True:
            exits = self._exits()
            cause = root_cause(exits)
            if cause is None or cause.signalled or time.monotonic() >= deadline or self.signal_received is not None:
                break
            time.sleep(0.05)
        return cause or self._exit_of(failed)

    def _exits(self) -> list[ProcessExit]:
        """What is known of every process that has ended, trainer agents resolved to their failed rank."""
        return [self._exit_of(proc) for proc in self.running if proc.returncode is not None]

    def _exit_of(self, proc: Running) -> ProcessExit:
        for reader in proc.readers:
            reader.join(timeout=2)  # the exit report and torchrun's failure summary are its last lines
        spec = proc.spec
        report = proc.exit_report or {}
        after_teardown = self.teardown_started is not None and proc.observed_at >= self.teardown_started
        stopped = bool(report.get("stopped", after_teardown))
        how = ""
        if "returncode" in report:
            returncode = int(report["returncode"])
        elif self.transport.name == "ssh" and proc.returncode == SSH_FAILED:
            returncode, how = proc.returncode, "lost its ssh connection (ssh exit status 255)"
        else:
            returncode = returncode_of_status(proc.returncode)
        role, index, pid = ("torchrun" if spec.is_agent else spec.role), spec.index, report.get("pid")
        if spec.is_agent and not stopped:
            failed_rank = self._root_cause_rank(spec.label)
            if failed_rank is not None:
                role, index = "trainer", spec.machine_id * self.num_trainers + failed_rank[0]
                returncode, pid = failed_rank[1], failed_rank[2]
        label = f"{spec.machine_id}/trainer/{index}" if role == "trainer" else spec.label
        with self.print_lock:
            last = self.last_stderr.get(label, "")
        return ProcessExit(
            role=role,
            machine_id=spec.machine_id,
            index=index,
            returncode=returncode,
            observed_at=proc.observed_at,
            pid=pid,
            host=spec.host,
            stopped=stopped,
            last_stderr=last,
            how=how,
            holds_partition=any(s.role == "server" for s in self.plan),
        )

    def _report(self, cause: ProcessExit) -> None:
        label = f"{cause.machine_id}/{cause.role}/{cause.index}"
        if cause.role == "torchrun":
            label = f"{cause.machine_id}/torchrun/{cause.machine_id}"
        lines = list(self.tails.get(label, ()))[-REPORT_LINES:]
        with self.print_lock:
            self.err.write(f"{self.name}: last {len(lines)} lines of [{label}]:\n")
            for line in lines:
                self.err.write(f"    {line}\n")
            self.err.flush()

    def _root_cause_rank(self, agent_label: str) -> tuple[int, int, int | None] | None:
        """torchrun's failure summary names the first failed local rank under 'Root Cause': (rank, exitcode, pid)."""
        lines = list(self.tails.get(agent_label, ()))
        for i, line in enumerate(lines):
            if "Root Cause" not in line:
                continue
            rank = code = pid = None
            for after in lines[i + 1 : i + 8]:
                if match := _ROOT_CAUSE_RANK.match(after):
                    rank = int(match.group(1))
                elif match := _ROOT_CAUSE_EXIT.match(after):
                    code, pid = int(match.group(1)), int(match.group(2))
            if rank is not None:
                return rank % self.num_trainers, code if code is not None else 1, pid
        return None

    # -- teardown -------------------------------------------------------------------------------

    def _teardown(self) -> None:
        self.teardown_started = time.monotonic()
        for proc in self.running:
            if proc.popen.poll() is None:
                with contextlib.suppress(OSError):
                    proc.popen.stdin.close()  # the wrapper sees EOF and stops its process tree
        deadline = time.monotonic() + self.grace_s + 5
        for proc in self.running:
            try:
                proc.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.say(f"{proc.spec.describe()} did not stop within {self.grace_s + 5:g} s; killing it")
                proc.popen.kill()
                proc.popen.wait()
        self._sweep()
        for proc in self.running:
            for reader in proc.readers:
                reader.join(timeout=2)
        seen_by = time.monotonic() + 2  # the waiter threads record each exit just after the wait above returns
        while any(p.returncode is None for p in self.running) and time.monotonic() < seen_by:
            time.sleep(0.01)

    def _sweep(self) -> None:
        """Last step on every machine: kill what still carries the job id, remove the job's shared memory."""
        dirs: dict[str, list[str]] = {}  # per host, in plan order (several machines may share one host)
        for spec in self.plan:
            dirs.setdefault(spec.host, []).extend(spec.cleanup_dirs)
        hosts = list(dirs)

        def sweep(host: str) -> tuple[str, subprocess.CompletedProcess]:
            argv = [self.python, "-m", "distgnn.launch.remote", "sweep", "--job-id", self.job_id]
            for path in dirs[host]:
                argv += ["--remove-dir", path]
            return host, run_short(self.transport, host, argv, timeout_s=30)

        with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
            for host, result in pool.map(sweep, hosts):
                if result.returncode != 0:
                    self.say(f"cleanup on {host} failed (status {result.returncode}): {result.stderr.strip()[-300:]}")
                    continue
                report = json.loads(result.stdout.strip().splitlines()[-1])
                if report["killed"] or report["shm_removed"]:
                    self.say(
                        f"cleanup on {host}: killed leftover processes {report['killed']}, "
                        f"removed shared memory {report['shm_removed']}"
                    )


def _lines(stream, show: Callable[[bytes], None] | None):
    """``stream``'s lines as they end; with ``show``, a line still being written is handed to it up to its
    last ``\\r`` as that comes (what was shown is left out of the line when it ends: see :func:`_unshown`)."""
    if show is None:
        yield from iter(stream.readline, b"")
        return
    pending, shown = b"", 0
    while chunk := stream.read1(65536):
        pending += chunk
        *done, pending = pending.split(b"\n")
        for line in done:
            yield _Partly(line + b"\n", shown)
            shown = 0
        cut = pending.rfind(b"\r") + 1
        if cut > shown:
            show(pending[shown:cut])
            shown = cut
    if pending:
        yield _Partly(pending, shown)


class _Partly(bytes):
    """A line of which the first ``shown`` bytes were already echoed."""

    def __new__(cls, data: bytes, shown: int) -> _Partly:
        line = super().__new__(cls, data)
        line.shown = shown
        return line


def _unshown(raw: bytes) -> str:
    """What of a line was not echoed yet, without its line end."""
    return raw[getattr(raw, "shown", 0) :].decode("utf-8", "replace").rstrip("\r\n")


def _key(e: ProcessExit) -> tuple[str, int, int]:
    return e.role, e.machine_id, e.index
