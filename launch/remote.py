"""The small program the launcher runs on every machine, around every job process.

``python -m distgnn.launch.remote run --job-id J -- ARGV...`` reads the job token
from the first line of stdin (so it never shows in a process listing), starts
ARGV with the token in its environment, and owns the whole process tree below
it: it is a child subreaper, so even processes that start their own session
(torchrun's workers do) stay its descendants. When the launcher goes away (stdin
reaches end of file: the launcher closed it, or the ssh connection dropped) or
sends SIGTERM/SIGINT/SIGHUP, it stops the tree (SIGTERM, then SIGKILL after a
grace period) and removes the job's shared memory on this machine. When ARGV
exits, it stops whatever ARGV left behind, writes one ``EXIT_REPORT`` line
on stderr (ARGV's pid and status, for the launcher's failure report) and exits
with ARGV's status (128 + N for a death by signal N).

``check`` answers the launcher's preflight (is distgnn importable here, are the
ports free, a free port for torchrun's rendezvous); ``sweep`` is the launcher's
last word on a machine: it kills any process still carrying the job's id in its
environment and removes the job's shared memory.

Linux only (``/proc``, ``prctl``). Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import fcntl
import importlib.util
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

from distgnn.launch import env as E

PR_SET_CHILD_SUBREAPER = 36
SIOCGIFADDR = 0x8915
SHM_DIR = Path("/dev/shm")
# The last cleanup (``sweep``) sends SIGKILL to what carries the job id this many times, this far apart, while
# any is left (a process may still be forking when first killed).
SWEEP_ROUNDS = 20
SWEEP_INTERVAL_S = 0.05
#: The wrapper's last stderr line starts with this, followed by JSON: ``{"pid", "returncode", "stopped"}``
#: (``returncode`` in subprocess convention, ``stopped``: the wrapper stopped it). The launcher reads it.
EXIT_REPORT = "distgnn-launch-exit "


def shm_prefix(job_id: str) -> str:
    """Every /dev/shm name a job creates starts with this."""
    return f"distgnn-{job_id}-"


def remove_job_shm(job_id: str) -> list[str]:
    """Remove the job's /dev/shm files on this machine; returns the names removed."""
    removed = []
    for path in SHM_DIR.glob(shm_prefix(job_id) + "*"):
        try:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
            removed.append(path.name)
        except FileNotFoundError:
            pass
    return removed


def _parent_map() -> dict[int, int]:
    parents = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may contain spaces and parentheses: fields follow the last ')'.
        fields = stat[stat.rfind(b")") + 2 :].split()
        parents[int(entry.name)] = int(fields[1])
    return parents


def descendants(pid: int) -> list[int]:
    """Every living process below ``pid`` (children, grandchildren, ...)."""
    children: dict[int, list[int]] = {}
    for child, parent in _parent_map().items():
        children.setdefault(parent, []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _reap(main_child: subprocess.Popen | None) -> None:
    """Collect exited children, including orphans re-parented to us (we are their subreaper).

    The main child's status is handed to its Popen object, which would otherwise never see it.
    """
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if main_child is not None and pid == main_child.pid:
            main_child.returncode = os.waitstatus_to_exitcode(status)


def stop_tree(grace_s: float, main_child: subprocess.Popen | None = None) -> None:
    """SIGTERM every descendant, then SIGKILL what is left after ``grace_s``."""
    me = os.getpid()
    _signal_all(descendants(me), signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _reap(main_child)
        if not descendants(me):
            return
        time.sleep(0.05)
    # Processes may still be forking: repeat until the tree is empty.
    for _ in range(50):
        left = descendants(me)
        if not left:
            return
        _signal_all(left, signal.SIGKILL)
        time.sleep(0.02)
        _reap(main_child)


def _become_owner() -> None:
    # A fresh session: the launcher's terminal signals do not reach the job directly
    # (PermissionError: we already lead one).
    with contextlib.suppress(PermissionError):
        os.setsid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        message = f"prctl(PR_SET_CHILD_SUBREAPER) failed (errno {ctypes.get_errno()}); detached processes may survive"
        print(f"distgnn-launch wrapper: {message}", file=sys.stderr)


def _read_line(fd: int) -> str:
    """One line from ``fd``, byte by byte: nothing past it may sit in a buffer we do not read."""
    data = bytearray()
    while True:
        byte = os.read(fd, 1)
        if not byte or byte == b"\n":
            return data.decode()
        data += byte


def run(job_id: str, argv: list[str], grace_s: float, remove_dirs: list[str]) -> int:
    token = _read_line(0).strip()
    if not token:
        print("distgnn-launch wrapper: no job token on stdin; start jobs through distgnn-launch", file=sys.stderr)
        return 2
    _become_owner()
    stop = threading.Event()  # set by the stdin watcher
    signalled: list[int] = []  # a signal handler must not take locks (Event.set does): it only appends

    def on_signal(signum, frame):
        signalled.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)

    def watch_stdin():
        # The launcher keeps our stdin open for the life of the job; EOF means it is gone.
        # Raw reads: a daemon thread blocked in sys.stdin would abort the interpreter at exit.
        while os.read(0, 4096):
            pass
        stop.set()

    try:
        child = subprocess.Popen(argv, env={**os.environ, E.TOKEN: token}, stdin=subprocess.DEVNULL)
    except OSError as exc:
        print(f"distgnn-launch wrapper: cannot start {argv[0]!r}: {exc}", file=sys.stderr)
        return 127
    threading.Thread(target=watch_stdin, daemon=True).start()
    while child.returncode is None and not stop.is_set() and not signalled:
        time.sleep(0.1)
        _reap(child)
    stopped = child.returncode is None
    stop_tree(grace_s, child)
    if child.returncode is None:
        child.returncode = os.waitstatus_to_exitcode(os.waitpid(child.pid, 0)[1])
    if stopped:
        remove_job_shm(job_id)
    for path in remove_dirs:
        shutil.rmtree(path, ignore_errors=True)
    code = child.returncode
    report = {"pid": child.pid, "returncode": code, "stopped": stopped}
    print(EXIT_REPORT + json.dumps(report), file=sys.stderr, flush=True)
    return 128 - code if code < 0 else code


def _environ_has(pid: int, entry: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return entry in f.read().split(b"\0")
    except OSError:
        return False


def sweep(job_id: str, remove_dirs: list[str]) -> int:
    """Kill every process of the job on this machine and remove its shared memory; prints a JSON summary."""
    entry = f"{E.JOB_ID}={job_id}".encode()
    me = os.getpid()
    killed = []
    for _ in range(SWEEP_ROUNDS):
        pids = [pid for pid in _parent_map() if pid != me and _environ_has(pid, entry)]
        if not pids:
            break
        _signal_all(pids, signal.SIGKILL)
        killed.extend(p for p in pids if p not in killed)
        time.sleep(SWEEP_INTERVAL_S)
    for path in remove_dirs:
        shutil.rmtree(path, ignore_errors=True)
    print(json.dumps({"killed": killed, "shm_removed": remove_job_shm(job_id)}), flush=True)
    return 0


def _port_free(port: int, address: str | None) -> bool:
    """Whether a server could bind ``port`` on ``address``, the address servers listen on.

    Checking the wildcard address instead would see the same port on another address of this host as
    taken: machines simulated on one host (127.0.0.1, 127.0.0.2) share port numbers, and their checks run
    at the same time.
    """
    family = socket.AF_INET6 if address and ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((address or "", port))
        except OSError as e:
            if address and e.errno == errno.EADDRNOTAVAIL:
                return _port_free(port, None)  # not an address of this host: the report's interface says so
            return False
    return True


def interface_of(ip: str) -> str | None:
    """The network interface whose (primary IPv4) address is ``ip``, or None."""
    if ":" in ip:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                answer = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address on this interface
            if socket.inet_ntoa(answer[20:24]) == ip:
                return name
    return None


def check(ports: list[int], want_free_port: bool, address: str | None) -> int:
    """Preflight on one machine; prints a JSON report."""
    report = {
        "python": sys.executable,
        "interface": interface_of(address) if address else None,
        "torch": importlib.util.find_spec("torch") is not None,
        "busy_ports": [p for p in ports if not _port_free(p, address)],
    }
    if want_free_port:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            report["free_port"] = s.getsockname()[1]
    print(json.dumps(report), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m distgnn.launch.remote", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="run one job process, owning its process tree")
    p_run.add_argument("--job-id", required=True)
    p_run.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL")
    p_run.add_argument("--remove-dir", action="append", default=[], help="directory to delete at the end")
    p_run.add_argument("argv", nargs=argparse.REMAINDER)
    p_sweep = sub.add_parser("sweep", help="kill the job's processes and remove its shared memory here")
    p_sweep.add_argument("--job-id", required=True)
    p_sweep.add_argument("--remove-dir", action="append", default=[])
    p_check = sub.add_parser("check", help="preflight report as JSON")
    p_check.add_argument("--ports", type=int, nargs="*", default=[])
    p_check.add_argument("--free-port", action="store_true")
    p_check.add_argument("--address", help="report the interface holding this address")
    args = parser.parse_args(argv)
    if args.command == "run":
        command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        if not command:
            parser.error("run needs a command after --")
        return run(args.job_id, command, args.grace, args.remove_dir)
    if args.command == "sweep":
        return sweep(args.job_id, args.remove_dir)
    return check(args.ports, args.free_port, args.address)


if __name__ == "__main__":
    sys.exit(main())
