"""The per-process wrapper (``distgnn.launch.remote``): token on stdin, owning and stopping a process tree."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launch_progs.harness import alive

# A job process that reports its token, leaves a shared-memory file, and starts a grandchild in
# its own session (as torchrun does with its workers), so a process-group kill would miss it.
CHILD = r"""
import hashlib, os, subprocess, sys, time
out = sys.argv[1]
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
open(f"/dev/shm/distgnn-{os.environ['DISTGNN_JOB_ID']}-p0-test", "w").close()
token = os.environ.get("DISTGNN_TOKEN", "")
with open(out + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {grandchild.pid} {hashlib.sha256(token.encode()).hexdigest()}")
os.rename(out + ".tmp", out)
code = int(sys.argv[2])
if code >= 0:
    sys.exit(code)
time.sleep(600)
"""


def start_wrapper(tmp_path: Path, job_id: str, exit_code: int) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / "pids"
    argv = [sys.executable, "-m", "distgnn.launch.remote", "run", "--job-id", job_id, "--grace", "2"]
    argv += ["--remove-dir", str(tmp_path / "logs"), "--", sys.executable, "-c", CHILD, str(out), str(exit_code)]
    (tmp_path / "logs").mkdir()
    env = {**os.environ, "DISTGNN_JOB_ID": job_id}
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    return proc, out


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 20) -> list[str]:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the job process did not start"
        time.sleep(0.05)
    return path.read_text().split()


def wait_dead(pids: list[int], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids):
        assert time.monotonic() < deadline, f"still alive: {[p for p in pids if alive(p)]}"
        time.sleep(0.05)


def test_eof_on_stdin_stops_the_whole_tree_and_removes_shm(tmp_path):
    job_id = f"jw{secrets.token_hex(3)}"
    token = secrets.token_hex(16)
    proc, out = start_wrapper(tmp_path, job_id, exit_code=-1)
    proc.stdin.write(f"{token}\n".encode())
    proc.stdin.flush()
    child, grandchild, token_sha = wait_for(out, proc)
    assert token_sha == hashlib.sha256(token.encode()).hexdigest()
    with open(f"/proc/{child}/cmdline", "rb") as f:
        assert token.encode() not in f.read()
    assert alive(int(grandchild))
    proc.stdin.close()  # what the launcher does to stop a machine; also what a dropped ssh connection does
    assert proc.wait(timeout=15) == 128 + signal.SIGTERM  # stopped, not finished
    wait_dead([int(child), int(grandchild)])
    assert not list(Path("/dev/shm").glob(f"distgnn-{job_id}-*"))
    assert not (tmp_path / "logs").exists()


def test_sigterm_stops_the_whole_tree(tmp_path):
    job_id = f"jw{secrets.token_hex(3)}"
    proc, out = start_wrapper(tmp_path, job_id, exit_code=-1)
    proc.stdin.write(b"tok\n")
    proc.stdin.flush()
    child, grandchild, _ = wait_for(out, proc)
    proc.send_signal(signal.SIGTERM)  # what a fallback `kill` on the machine does
    assert proc.wait(timeout=15) == 128 + signal.SIGTERM
    wait_dead([int(child), int(grandchild)])
    assert not list(Path("/dev/shm").glob(f"distgnn-{job_id}-*"))
    proc.stdin.close()


def test_exit_status_passes_through_and_leftovers_are_stopped(tmp_path):
    job_id = f"jw{secrets.token_hex(3)}"
    proc, out = start_wrapper(tmp_path, job_id, exit_code=3)
    proc.stdin.write(b"tok\n")
    proc.stdin.flush()
    _, grandchild, _ = wait_for(out, proc)
    assert proc.wait(timeout=15) == 3
    wait_dead([int(grandchild)])
    for leftover in Path("/dev/shm").glob(f"distgnn-{job_id}-*"):  # a normal exit leaves shm to the sweep
        leftover.unlink()


def test_death_by_signal_is_128_plus_signal(tmp_path):
    job_id = f"jw{secrets.token_hex(3)}"
    proc, out = start_wrapper(tmp_path, job_id, exit_code=-1)
    proc.stdin.write(b"tok\n")
    proc.stdin.flush()
    child, grandchild, _ = wait_for(out, proc)
    os.kill(int(child), signal.SIGKILL)
    assert proc.wait(timeout=15) == 128 + signal.SIGKILL
    wait_dead([int(grandchild)])
    for leftover in Path("/dev/shm").glob(f"distgnn-{job_id}-*"):
        leftover.unlink()


def test_no_token_no_start(tmp_path):
    proc, out = start_wrapper(tmp_path, f"jw{secrets.token_hex(3)}", exit_code=0)
    _, stderr = proc.communicate(input=b"", timeout=15)
    assert proc.returncode == 2 and b"no job token" in stderr
    assert not out.exists()


@pytest.mark.parametrize("ports_busy", [False, True])
def test_check_reports_busy_ports_and_a_free_port(ports_busy):
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        if ports_busy:
            s.listen()
        port = s.getsockname()[1]
        argv = [sys.executable, "-m", "distgnn.launch.remote", "check", "--ports", str(port), "--free-port"]
        argv += ["--address", "127.0.0.1"]
        report = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    assert report["busy_ports"] == [port]  # bound (listening or not) is busy
    assert report["interface"] == "lo"
    assert report["torch"] is True and 0 < report["free_port"] < 65536


def test_check_looks_at_the_machines_own_address():
    """Machines simulated on one host share port numbers; one's server port is not another's."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        s.listen()
        port = s.getsockname()[1]
        busy = {}
        for address in ("127.0.0.1", "127.0.0.2"):
            argv = [sys.executable, "-m", "distgnn.launch.remote", "check", "--ports", str(port), "--address", address]
            busy[address] = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    assert busy["127.0.0.1"]["busy_ports"] == [] and busy["127.0.0.2"]["busy_ports"] == [port]


def test_sweep_kills_processes_of_the_job_only(tmp_path):
    job_id = f"jw{secrets.token_hex(3)}"
    mine = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], env={**os.environ, "DISTGNN_JOB_ID": job_id}
    )
    other = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], env={**os.environ, "DISTGNN_JOB_ID": job_id + "x"}
    )
    shm = Path(f"/dev/shm/distgnn-{job_id}-p1-x")
    shm.write_bytes(b"")
    try:
        deadline = time.monotonic() + 10
        while not Path(f"/proc/{mine.pid}/environ").read_bytes().count(job_id.encode()):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        argv = [sys.executable, "-m", "distgnn.launch.remote", "sweep", "--job-id", job_id]
        report = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
        assert report == {"killed": [mine.pid], "shm_removed": [shm.name]}
        assert mine.wait(timeout=60) == -signal.SIGKILL
        assert other.poll() is None
    finally:
        other.kill()
        mine.kill()
        other.wait()
        mine.wait()
