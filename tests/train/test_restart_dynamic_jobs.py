"""TGN and snapshot jobs survive a killed trainer: ``distgnn-launch --max-restarts 1`` resumes them from their
last checkpoint and they end as the uninterrupted run does.

A job of restart_dynamic.py (2 machines x 1 trainer, no graph servers, CPU) runs once to its end, then
again with trainer 1 killed by SIGKILL right after its first checkpoint. The launcher must name the dead
trainer within 10 s, restart the job, and the job must resume mid-run and end with exit 0, nothing of it left in
the process table or /dev/shm, and the same result and final checkpoint (weights, optimizer, node memory and
mailbox, random states) as the uninterrupted run, bit for bit: every trainer runs one thread, gloo adds the
gradients in a fixed order and every random stream is restored from the checkpoint.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from launch_progs.harness import assert_nothing_left, trainer_pid
from restart_dynamic import (
    ERROR,
    JOBS,
    checkpoint_steps,
    launcher_argv,
    local_job,
    result_of,
    resumed_step,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform != "linux", reason="needs Linux /proc")]


def final_checkpoint(checkpoint_dir: Path) -> dict[str, np.ndarray]:
    """Every array of the newest checkpoint, by file name (either checkpoint format)."""
    (newest,) = checkpoint_steps(checkpoint_dir)[-1:]
    directory = checkpoint_dir / f"step-{newest:08d}"
    return {p.name: np.load(p) for p in sorted(directory.rglob("*.npy"))}


def run_to_end(workspace: Path, name: str, *flags: str):
    job = local_job(workspace)
    proc = job.start(launcher_argv(workspace, JOBS[name].command(workspace / "ck"), *flags))
    return job, proc


# The two jobs whose state crosses trainers: each TGN copy's memory and mailbox, the contiguous schedule's
# recurrent state handed from trainer 0 to 1. benchmarks/restart.py --jobs runs every job of JOBS the same way.
@pytest.mark.parametrize("name", ["tgn-memory2", "snapshot-contiguous"])
def test_killed_trainer_resumes_and_ends_as_uninterrupted(tmp_path, name):
    spec = JOBS[name]
    job, proc = run_to_end(tmp_path / "plain", name)
    assert proc.wait(timeout=240) == 0, job.stderr()[-5000:]
    expected, expected_files = result_of(job.stdout()), final_checkpoint(tmp_path / "plain" / "ck")

    job, proc = run_to_end(tmp_path / "killed", name, "--max-restarts", "1")
    try:
        running = lambda: proc.poll() is None  # noqa: E731
        wait_until(lambda: checkpoint_steps(tmp_path / "killed" / "ck"), 240, "the first checkpoint", running)
        pid = trainer_pid(job.job_id(), 1, spec.script)
        assert pid is not None, f"trainer 1 of job {job.job_id()} is not in the process table"
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        named = wait_until(lambda: ERROR in job.stderr(), 60, "the root-cause line", running)
        assert named - killed < 10, f"the dead trainer was named {named - killed:.1f} s after the kill"
        assert proc.wait(timeout=240) == 0, job.stderr()[-5000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    err = job.stderr()
    errors = [line for line in err.splitlines() if line.startswith(ERROR)]
    cause = f"{ERROR} trainer 1 of machine 1 (host 127.0.0.1, pid {pid}) was killed by SIGKILL"
    assert len(errors) == 1 and errors[0].startswith(cause), errors
    assert f"restarting job {job.job_id()} (1 of 1)" in err
    at = resumed_step(job.stdout())
    assert 0 < at < spec.steps and at % spec.checkpoint_every == 0, at
    assert_nothing_left(job, job.job_id())

    got = result_of(job.stdout())
    volatile = {"epoch_time_s", "epoch_times_s", "events_per_s", "load_imbalance", "eval_time_s"}  # wall-clock figures
    assert {k: v for k, v in got.items() if k not in volatile} == {
        k: v for k, v in expected.items() if k not in volatile
    }
    files = final_checkpoint(tmp_path / "killed" / "ck")
    assert sorted(files) == sorted(expected_files)
    for file, array in expected_files.items():
        np.testing.assert_array_equal(files[file], array, err_msg=file)
