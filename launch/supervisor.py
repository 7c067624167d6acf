"""Runs a launch plan: starts every process, streams their output, and tears the job down.

Each process runs under the wrapper of ``remote.py`` on its machine, reached
through a transport (ssh or local). Output lines come back prefixed with
``[machine/role/rank]``. The job succeeds when every trainer exits 0 (servers
then get a grace period to exit on their own). Any other exit with a non-zero
status, a lost ssh connection, SIGINT or SIGTERM stops the job: stdin of every
wrapper is closed (each stops its process tree), stragglers are killed, and a
sweep on every machine kills whatever still carries the job id and removes the
job's shared memory.
"""

from __future__ import annotations

import collections
import contextlib
import json
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TextIO

from distgnn.launch import env as E
from distgnn.launch.plan import ProcessSpec, wrapper_argv
from distgnn.launch.transport import SSH_FAILED, run_short

TAIL_LINES = 200
REPORT_LINES = 25
SERVER_EXIT_GRACE_S = 2.0
_TEE_PREFIX = re.compile(r"^\[default(\d+)\]:(.*)$", re.DOTALL)
_ROOT_CAUSE_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")


@dataclass
class Running:
    """A started process of the plan and what the launcher knows about it."""

    spec: ProcessSpec
    popen: subprocess.Popen
    readers: list[threading.Thread] = field(default_factory=list)
    returncode: int | None = None


def describe_status(returncode: int, transport_name: str) -> str:
    if transport_name == "ssh" and returncode == SSH_FAILED:
        return "lost its ssh connection (ssh exit status 255)"
    if returncode < 0:
        return f"was killed by signal {signal.Signals(-returncode).name} (the launcher's wrapper itself)"
    if returncode > 128 and returncode - 128 in signal.valid_signals():
        return f"was killed by signal {signal.Signals(returncode - 128).name} (exit status {returncode})"
    return f"exited with status {returncode}"


class Job:
    """One run of a plan. ``run()`` returns the launcher's exit status."""

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
    ) -> None:
        self.plan = plan
        self.transport = transport
        self.python = python
        self.token = token
        self.num_trainers = num_trainers
        self.grace_s = grace_s
        self.out, self.err = out, err
        self.job_id = plan[0].env[E.JOB_ID]
        self.running: list[Running] = []
        self.events: queue.Queue[Running] = queue.Queue()
        self.tails: dict[str, collections.deque[str]] = collections.defaultdict(
            lambda: collections.deque(maxlen=TAIL_LINES)
        )
        self.print_lock = threading.Lock()
        self.signal_received: int | None = None
        # While a failed or interrupted job is torn down, the others' dying words (torchrun's
        # SignalException tracebacks) are kept in the tails but not echoed.
        self.echo = True

    # -- output ---------------------------------------------------------------------------------

    def say(self, message: str) -> None:
        with self.print_lock:
            self.err.write(f"distgnn-launch: {message}\n")
            self.err.flush()

    def _pump(self, proc: Running, stream, sink: TextIO) -> None:
        spec = proc.spec
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            label = spec.label
            tee = _TEE_PREFIX.match(line) if spec.role == "trainer" else None
            if tee:
                rank = spec.machine_id * self.num_trainers + int(tee.group(1))
                label, line = f"{spec.machine_id}/trainer/{rank}", tee.group(2)
            self.tails[label].append(line)
            if not self.echo:
                continue
            with self.print_lock:
                sink.write(f"[{label}] {line}\n")
                sink.flush()
        stream.close()

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
            proc.returncode = popen.wait()
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
            self.say(f"FAILED: {self._describe_failure(failed)}; stopping job {self.job_id}")
        if self.signal_received is not None or failed is not None:
            self.echo = False
        self._teardown()
        if self.signal_received is not None:
            self.say(f"job {self.job_id} stopped on every machine")
            return 128 + self.signal_received
        if failed is not None:
            self._report(failed)
            return 1
        self.say(f"job {self.job_id} finished")
        return 0

    def _let_servers_finish(self) -> Running | None:
        """Trainers are done: servers that exit on their own get a moment, the rest are stopped. Returns a failed server."""
        deadline = time.monotonic() + SERVER_EXIT_GRACE_S
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

    # -- teardown -------------------------------------------------------------------------------

    def _teardown(self) -> None:
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

    def _failure_label(self, failed: Running) -> str:
        """The label whose output explains the failure: the failed trainer rank when torchrun names one."""
        spec = failed.spec
        if spec.role == "trainer":
            rank = self._root_cause_rank(spec.label)
            if rank is not None:
                return f"{spec.machine_id}/trainer/{rank}"
        return spec.label

    def _describe_failure(self, failed: Running) -> str:
        for reader in failed.readers:
            reader.join(timeout=2)  # its last lines (torchrun's failure summary) name the root cause
        spec = failed.spec
        status = describe_status(failed.returncode, self.transport.name)
        label = self._failure_label(failed)
        if label != spec.label:
            rank = label.rsplit("/", 1)[1]
            return f"trainer rank {rank} on machine {spec.machine_id} ({spec.host}) failed; its torchrun agent {status}"
        return f"{spec.describe()} [{spec.label}] {status}"

    def _report(self, failed: Running) -> None:
        label = self._failure_label(failed)
        lines = list(self.tails.get(label, ()))[-REPORT_LINES:]
        with self.print_lock:
            self.err.write(f"distgnn-launch: last {len(lines)} lines of [{label}]:\n")
            for line in lines:
                self.err.write(f"    {line}\n")
            self.err.flush()

    def _root_cause_rank(self, agent_label: str) -> int | None:
        """torchrun's failure summary names the first failed rank under 'Root Cause'."""
        lines = list(self.tails.get(agent_label, ()))
        for i, line in enumerate(lines):
            if "Root Cause" in line:
                for after in lines[i + 1 : i + 8]:
                    match = _ROOT_CAUSE_RANK.match(after)
                    if match:
                        return int(match.group(1))
        return None
