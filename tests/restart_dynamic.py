"""Jobs without graph servers for kill, restart and signal tests and benchmarks: TGN and snapshot training.

Shared by tests/train/test_restart_dynamic_jobs.py, tests/train/test_signals_local.py, benchmarks/restart.py
and benchmarks/stress.py. Each job is small (seconds of training) and runs on 2 machines x 1 trainer, CPU, one
thread per trainer, checkpointing every few steps and resuming from the latest checkpoint (``--resume auto``),
so that ``distgnn-launch --max-restarts 1`` continues it after a trainer is killed:

* ``tgn-memory2``: TGN, memory parallelism 2 (each trainer owns a memory copy and its mailbox);
* ``tgn-epoch2``: TGN, epoch parallelism 2 (two trainers share one copy, a batch in flight each);
* ``snapshot-<schedule>``: GConvGRU on a synthetic snapshot sequence in windows of 3, for each schedule
  (the contiguous schedule hands a window's recurrent state from trainer 0 to trainer 1).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from launch_progs.harness import FakeJob, job_pids
from netns_cluster import free_port

ROOT = Path(__file__).resolve().parents[1]
TGN = ROOT / "examples" / "tgn" / "train_dist.py"
SNAPSHOT = ROOT / "examples" / "snapshot" / "train_dist.py"
ERROR = "distgnn-launch: error:"


@dataclass(frozen=True)
class DynamicJob:
    """A job: its script, its flags (without the checkpoint ones) and how many steps it trains."""

    name: str
    script: Path
    flags: tuple[str, ...]
    steps: int
    checkpoint_every: int

    def command(self, checkpoint_dir: Path | None, *extra: str) -> list[str]:
        """The trainer's command line: checkpoints in ``checkpoint_dir`` (None: none), resuming from the latest."""
        argv = [sys.executable, str(self.script), *self.flags, "--num-threads", "1", "--quiet", *extra]
        if checkpoint_dir is not None:
            argv += ["--checkpoint-dir", str(checkpoint_dir), "--checkpoint-every", str(self.checkpoint_every)]
            argv += ["--resume", "auto"]
        return argv


TGN_FLAGS = (
    "--dataset", "synthetic-events:200:4000", "--memory-dim", "8", "--time-dim", "4", "--embedding-dim", "8",
    "--neighbors", "4", "--lr", "0.003", "--num-parts", "2", "--batch-size", "100",
)  # fmt: skip
SNAPSHOT_FLAGS = (
    "--dataset", "synthetic", "--synthetic-nodes", "1500", "--synthetic-snapshots", "20", "--window", "3",
    "--cheb-k", "2", "--hidden", "8", "--num-parts", "2",
)  # fmt: skip

# TGN: 28 training batches of 100 (2800 of the 4000 events): 14 steps an epoch per copy under memory parallelism
# 2, 28 under epoch parallelism 2 (every batch trained twice, one step each); a checkpoint every 5 steps never
# falls on an epoch's end, so a restart resumes mid-epoch.
JOBS = {
    "tgn-memory2": DynamicJob("tgn-memory2", TGN, (*TGN_FLAGS, "--memory-parallelism", "2", "--epochs", "3"), 42, 5),
    "tgn-epoch2": DynamicJob("tgn-epoch2", TGN, (*TGN_FLAGS, "--epoch-parallelism", "2", "--epochs", "3"), 84, 5),
    **{
        f"snapshot-{schedule}": DynamicJob(
            f"snapshot-{schedule}", SNAPSHOT, (*SNAPSHOT_FLAGS, "--schedule", schedule, "--epochs", "20"), 20, 4
        )
        for schedule in ("blad", "contiguous", "vertex")
    },
}


def local_job(workspace: Path) -> FakeJob:
    """A workspace whose ip_config lists two machines on this host."""
    base = free_port(span=20)
    return FakeJob(workspace, ["127.0.0.1", "127.0.0.1"], ports=[base, base + 10])


def launcher_argv(workspace: Path, train: list[str], *flags: str) -> list[str]:
    """``distgnn-launch --local`` with the ip_config ``workspace/ip.txt``: no graph servers, 1 trainer a machine."""
    argv = [sys.executable, "-m", "distgnn.launch.cli", "--ip-config", "ip.txt", "--num-servers", "0"]
    return [*argv, "--num-trainers", "1", "--workspace", str(workspace), "--local", *flags, "--", *train]


def checkpoint_steps(checkpoint_dir: Path) -> list[int]:
    """The steps of the complete checkpoints in ``checkpoint_dir``."""
    return sorted(int(p.name[5:]) for p in checkpoint_dir.glob("step-*") if (p / "manifest.json").is_file())


def result_of(output: str) -> dict:
    """The job's ``RESULT {json}`` (printed once, by rank 0)."""
    lines = [line for line in output.splitlines() if "RESULT " in line]
    assert len(lines) == 1, f"expected one RESULT line, got {lines}"
    return json.loads(lines[0].split("RESULT ", 1)[1])


def resumed_step(output: str) -> int:
    """The step rank 0 says it resumed from."""
    (line,) = [x for x in output.splitlines() if x.startswith("[0/trainer/0] resumed from ")]
    return int(line.rsplit("(step ", 1)[1].rstrip(")"))


def wait_until(predicate, timeout: float, what: str, alive=lambda: True, poll: float = 0.01) -> float:
    """Poll until ``predicate()`` holds (while ``alive()``); returns the monotonic time it first did."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if not alive():
            raise AssertionError(f"the job ended before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(poll)
    return time.monotonic()


def shm_segments(job_id: str) -> list[str]:
    return sorted(p.name for p in Path("/dev/shm").glob(f"distgnn-{job_id}-*"))


def live_job_processes(job_id: str) -> list[int]:
    """Processes that carry the job id and are not zombies."""
    from launch_progs.harness import alive

    return [pid for pid in job_pids(job_id) if pid != os.getpid() and alive(pid)]
