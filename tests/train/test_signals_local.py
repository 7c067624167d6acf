"""Ctrl-C and SIGTERM stop a busy ``--local`` job of TGN or snapshot training (trainers alone; a job with graph
servers is tests/train/test_job.py's SIGTERM case, and benchmarks/stress.py runs every kind with both signals).

The signal goes to the ``--local`` parent only (as ``kill`` sends it; Ctrl-C in a terminal reaches the whole
process group, which the trainers handle on their own) once rank 0 has printed its first epoch, so the trainers
are in the middle of the next one. The parent must exit within 10 s with 128 + the signal, leaving no process
of the job and no /dev/shm segment of it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from launch_progs.harness import alive
from restart_dynamic import JOBS

from distgnn.launch.remote import descendants

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform != "linux", reason="needs Linux /proc")]

COMMANDS = {
    "tgn": [*JOBS["tgn-memory2"].command(None)[1:], "--epochs", "1000", "--no-eval"],
    "snapshot": [*JOBS["snapshot-contiguous"].command(None)[1:], "--epochs", "100000", "--no-eval"],
}


def job_id_of(pids: list[int]) -> str | None:
    for pid in pids:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for entry in environ:
            if entry.startswith(b"DISTGNN_JOB_ID="):
                return entry.split(b"=", 1)[1].decode()
    return None


# One signal per job kind (each is handled the same way by the parent; benchmarks/stress.py sends both to each).
@pytest.mark.parametrize("name, sig", [("tgn", signal.SIGTERM), ("snapshot", signal.SIGINT)])
def test_a_signal_stops_a_busy_local_job_within_10_s(tmp_path, name, sig):
    argv = [sys.executable, *COMMANDS[name], "--local", "--workdir", str(tmp_path)]
    # SIGINT at its default in the job whatever the test runner inherited (a background shell ignores it).
    reset = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
    proc = subprocess.Popen(
        argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=reset
    )
    lines: list[str] = []
    first_epoch = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("epoch"):
                first_epoch.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert first_epoch.wait(240), f"no epoch ended:\n{''.join(lines)}\n{proc.stderr.read()[-3000:]}"
        assert proc.poll() is None, "".join(lines)
        pids = descendants(proc.pid)
        job_id = job_id_of(pids)
        assert job_id is not None and len(pids) >= 2, pids
        proc.send_signal(sig)
        sent = time.monotonic()
        code = proc.wait(timeout=30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 128 + sig, (code, proc.stderr.read()[-3000:])
    assert took < 10, f"the job took {took:.1f} s to stop"
    assert [p for p in pids if alive(p)] == []
    assert sorted(p.name for p in Path("/dev/shm").glob(f"distgnn-{job_id}-*")) == []
