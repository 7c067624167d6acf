"""stop_processes: SIGTERM first, SIGKILL for what is left after the grace period; every process has exited."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from distgnn.launch.supervisor import stop_processes

IGNORES_SIGTERM = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"


def test_sigterm_stops_a_process_and_sigkill_the_one_that_ignores_it() -> None:
    polite = subprocess.Popen(
        [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE
    )
    stubborn = subprocess.Popen([sys.executable, "-c", IGNORES_SIGTERM], stdout=subprocess.PIPE)
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        for proc in (polite, stubborn):
            assert proc.stdout.readline().strip() == b"ready"  # its signal handlers are in place
        done.wait(30)
        start = time.monotonic()
        stop_processes([polite, stubborn, done], grace_s=1.0)
        assert 1.0 <= time.monotonic() - start < 10
        assert polite.returncode == -signal.SIGTERM
        assert stubborn.returncode == -signal.SIGKILL
        assert done.returncode == 0
    finally:
        for proc in (polite, stubborn, done):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
