"""A real job survives a killed trainer: ``distgnn-launch --max-restarts 1`` restarts it from its checkpoint.

GraphSAGE on Cora (examples/graphsage/train_dist.py, see restart_job.py), 2 machines x (1 server +
1 trainer), CPU. Trainer 1 is killed with SIGKILL once a checkpoint exists; the launcher names it, restarts
the job, the script resumes mid-epoch from the latest checkpoint (``--resume auto``) and the job ends with
exit 0 and the same result as a run that was never interrupted.

The tolerance is zero: GraphSAGE has no sparse (server-side, asynchronous) updates, DDP's gloo all-reduce
adds the two trainers' gradients in a fixed order, batches and dropout come from seeded streams that the
checkpoint restores, and every trainer runs one thread. So the resumed job's accuracies and final epoch loss
equal the uninterrupted run's exactly (measured: equal in every run so far, locally and across hosts).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
from launch_progs.harness import FakeJob, assert_nothing_left
from netns_cluster import free_port, netns_cluster_fixture
from restart_job import (
    BATCHES_PER_EPOCH,
    CHECKPOINT_EVERY,
    CORA,
    EPOCHS,
    checkpoint_exists,
    launcher_argv,
    partition_cora,
    result_of,
    step_records,
    train_command,
    trainer_pid,
    wait_for,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform != "linux", reason="needs Linux"),
    pytest.mark.skipif(not (CORA / "ind.cora.graph").exists(), reason=f"Cora files not found in {CORA}"),
]
SEED = 7


def local_job(workspace: Path) -> FakeJob:
    base = free_port(span=20)
    return FakeJob(workspace, ["127.0.0.1", "127.0.0.1"], ports=[base, base + 10])


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> tuple[Path, dict]:
    """The partition, and the RESULT of the job run to its end without a failure (distgnn-launch --local)."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    part_config = partition_cora(tmp)
    job = local_job(tmp)
    train = train_command(tmp / "checkpoints", tmp / "run", SEED)
    proc = job.start(launcher_argv(part_config, tmp, train, "--local"))
    assert proc.wait(timeout=120) == 0, job.stderr()[-5000:]
    assert_nothing_left(job, job.job_id())
    return part_config, result_of(job.stdout())


def kill_trainer_and_check_restart(job: FakeJob, proc, workspace: Path, host: str) -> None:
    """Kill trainer 1 once a checkpoint exists; the launcher must name it, restart the job, and the job must
    resume from a checkpoint mid-epoch and end with exit 0."""
    checkpoints, run_dir = workspace / "checkpoints", workspace / "run"
    wait_for(lambda: checkpoint_exists(checkpoints), 120, "the first checkpoint", lambda: proc.poll() is None)
    pid = trainer_pid(job.job_id(), rank=1)
    assert pid is not None, f"trainer 1 of job {job.job_id()} is not in the process table"
    os.kill(pid, signal.SIGKILL)
    assert proc.wait(timeout=180) == 0, job.stderr()[-5000:]
    err = job.stderr()
    errors = [line for line in err.splitlines() if line.startswith("distgnn-launch: error:")]
    named = f"distgnn-launch: error: trainer 1 of machine 1 (partition 1, host {host}, pid {pid}) was killed by SIGKILL"
    assert len(errors) == 1 and errors[0].startswith(named), errors  # (a last stderr line may follow)
    assert f"restarting job {job.job_id()} (1 of 1)" in err
    (line,) = [x for x in job.stdout().splitlines() if x.startswith("[0/trainer/0] resumed from ")]
    resumed_at = int(line.rsplit("(step ", 1)[1].rstrip(")"))
    assert resumed_at % CHECKPOINT_EVERY == 0 and resumed_at % BATCHES_PER_EPOCH != 0, line  # mid-epoch
    steps = [r["step"] for r in step_records(run_dir)]
    again = max(i for i, step in enumerate(steps) if step == resumed_at + 1)  # the restarted job's first step
    assert steps[again:] == list(range(resumed_at + 1, EPOCHS * BATCHES_PER_EPOCH + 1)), steps
    assert steps[:again] == list(range(1, again + 1)) and again >= resumed_at, steps  # before the kill
    assert_nothing_left(job, job.job_id())


def assert_same_result(got: dict, expected: dict) -> None:
    assert got["num_trainers"] == 2 and got["num_parts"] == 2
    assert got["test_acc"] > 0.6, got
    for key in ("val_acc", "test_acc", "train_loss"):
        assert got[key] == expected[key], (key, got[key], expected[key])


@pytest.fixture(scope="module")
def cluster():
    yield from netns_cluster_fixture(num_hosts=2)


@pytest.mark.netns
def test_killed_trainer_restarts_across_two_hosts(tmp_path, uninterrupted, cluster):
    part_config, expected = uninterrupted
    job = FakeJob(tmp_path, cluster.addresses)
    train = train_command(tmp_path / "checkpoints", tmp_path / "run", SEED)
    argv = launcher_argv(part_config, tmp_path, train, *cluster.ssh_flags(), "--max-restarts", "1")
    proc = job.start(argv, prefix=cluster.exec_prefix(0))
    try:
        kill_trainer_and_check_restart(job, proc, tmp_path, host=cluster.addresses[1])
    finally:
        if proc.poll() is None:
            proc.kill()
    assert_same_result(result_of(job.stdout()), expected)
    busy = cluster.job_processes()
    assert not any(busy.values()), f"processes left in the namespaces: {busy}"
