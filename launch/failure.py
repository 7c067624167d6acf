"""Says what died: picks the root cause among a failed job's process exits and words the report.

A job whose server dies takes every trainer down with it, and each of them
leaves a traceback; the one line that matters is the first death. Given what a
runner saw of each process (``ProcessExit``), ``root_cause`` picks that one:
the earliest failure the runner observed, except that a death by signal seen
shortly after another failure wins (a ``kill -9`` or an OOM kill is the
cause; the errors in its peers are its echo, and they can be observed first).
``failure_report`` prints it as one line, then folds every other exit into one
summary line that points at the run directory holding the full logs.

Used by the supervisor of ``distgnn-launch`` (ssh, local and Slurm modes) and
of the examples' ``--local`` runs (``launch/supervisor.py``). Standard library only.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: A death by signal observed up to this many seconds after another failure is still the root cause.
SIGNAL_PRECEDENCE_S = 1.0
#: The longest stderr line quoted in the root-cause line.
MAX_QUOTE_CHARS = 300


@dataclass(frozen=True)
class ProcessExit:
    """How one process of a job ended, as its runner saw it.

    Attributes:
        role: ``"server"``, ``"trainer"`` or ``"torchrun"`` (an agent running several trainers).
        machine_id: the machine's line in ip_config, which is also its partition id.
        index: the server id for a server, the global trainer rank for a trainer, the node rank for an agent.
        returncode: ``subprocess`` convention: ``-N`` for a death by signal N, else the exit status.
        observed_at: ``time.monotonic()`` when the runner saw the process end.
        pid: the process id, where known.
        host: the machine's address, where known.
        stopped: True when the runner itself stopped the process (tearing the job down).
        last_stderr: the last non-empty line the process wrote to stderr.
        how: says how it ended where the status alone does not (``lost its ssh connection``).
        holds_partition: False in a job without graph servers, where machine i holds no partition.
    """

    role: str
    machine_id: int
    index: int
    returncode: int
    observed_at: float
    pid: int | None = None
    host: str | None = None
    stopped: bool = False
    last_stderr: str = ""
    how: str = ""
    holds_partition: bool = True

    @property
    def failed(self) -> bool:
        """Ended on its own with a non-zero status (a process the runner stopped did not fail)."""
        return self.returncode != 0 and not self.stopped

    @property
    def signalled(self) -> bool:
        return self.returncode < 0

    def who(self) -> str:
        """``server 0 of machine 1 (partition 1, pid 4242)``."""
        details = [f"partition {self.machine_id}"] if self.holds_partition else []
        if self.host:
            details.append(f"host {self.host}")
        if self.pid is not None:
            details.append(f"pid {self.pid}")
        name = "torchrun agent" if self.role == "torchrun" else f"{self.role} {self.index}"
        return f"{name} of machine {self.machine_id} ({', '.join(details)})"


def describe_returncode(returncode: int) -> str:
    """``was killed by SIGKILL`` for -9, ``exited with code 1`` for 1."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with code {returncode}"


def returncode_of_status(status: int) -> int:
    """A shell-style status (``128 + N`` for a death by signal N) in ``subprocess`` convention."""
    if status > 128 and status - 128 in signal.valid_signals():
        return -(status - 128)
    return status


def root_cause(exits: Sequence[ProcessExit]) -> ProcessExit | None:
    """The failure that caused the others, or None when nothing failed.

    The earliest observed failure, unless a death by signal was observed within
    ``SIGNAL_PRECEDENCE_S`` of it: then the earliest such death.
    """
    failures = sorted((e for e in exits if e.failed), key=lambda e: e.observed_at)
    if not failures:
        return None
    first = failures[0]
    for candidate in failures:
        if candidate.observed_at - first.observed_at > SIGNAL_PRECEDENCE_S:
            break
        if candidate.signalled:
            return candidate
    return first


def root_cause_line(cause: ProcessExit) -> str:
    """``error: server 0 of machine 1 (partition 1, pid 4242) was killed by SIGKILL; last stderr line: ...``."""
    line = f"error: {cause.who()} {cause.how or describe_returncode(cause.returncode)}"
    quote = cause.last_stderr.strip()
    if quote:
        if len(quote) > MAX_QUOTE_CHARS:
            quote = quote[: MAX_QUOTE_CHARS - 3] + "..."
        line += f"; last stderr line: {quote}"
    return line


def _plural(count: int, role: str) -> str:
    name = "torchrun agent" if role == "torchrun" else role
    return f"{count} {name}{'' if count == 1 else 's'}"


def summary_line(others: Sequence[ProcessExit], run_dir: str | Path | None) -> str:
    """Every exit but the root cause in one line.

    ``3 trainers exited afterwards (codes 1, 1, 1); 2 servers were stopped; full logs in RUN_DIR``.
    """
    parts = []
    order = ("server", "trainer", "torchrun")
    for role in order:
        ended = sorted((e for e in others if e.role == role and not e.stopped), key=lambda e: e.observed_at)
        if ended:
            codes = ", ".join(signal.Signals(-e.returncode).name if e.signalled else str(e.returncode) for e in ended)
            parts.append(f"{_plural(len(ended), role)} exited afterwards (codes {codes})")
    stopped = [_plural(n, role) for role in order if (n := sum(1 for e in others if e.role == role and e.stopped))]
    if stopped:
        joined = ", ".join(stopped[:-1]) + " and " + stopped[-1] if len(stopped) > 1 else stopped[0]
        parts.append(f"{joined} {'was' if joined.startswith('1 ') and len(stopped) == 1 else 'were'} stopped")
    where = f"full logs in {run_dir}" if run_dir else "no log directory was kept"
    return "; ".join([*parts, where]) if parts else f"no other process failed; {where}"


def failure_report(exits: Sequence[ProcessExit], run_dir: str | Path | None) -> list[str]:
    """Two lines for a failed job: the root cause, then everything else; empty when nothing failed."""
    cause = root_cause(exits)
    if cause is None:
        return []
    others = [e for e in exits if e is not cause and (e.failed or e.stopped)]
    return [root_cause_line(cause), summary_line(others, run_dir)]
