"""A real job for restart tests and benchmarks: GraphSAGE on Cora under ``distgnn-launch``, with checkpoints.

Shared by tests/train/test_restart_real_job.py and benchmarks/restart.py. The job is
examples/graphsage/train_dist.py on Cora's METIS 2-way partition, one trainer per machine, saving a
checkpoint every ``CHECKPOINT_EVERY`` steps and (rank 0) a metrics record per step in its run directory.
Its trainers are found the way an operator would find them: in the process table, by the job id the
launcher prints and the rank torchrun gives each trainer.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from launch_progs import harness

ROOT = Path(__file__).resolve().parents[1]
CORA = ROOT.parent / "shared" / "data" / "planetoid"
TRAIN = ROOT / "examples" / "graphsage" / "train_dist.py"
CHECKPOINT_EVERY = 20
BATCHES_PER_EPOCH = 9
# Cora's 140 training nodes over 2 trainers in batches of 8 make 9 batches per epoch; with 19 epochs (171
# steps) no checkpoint (every 20 steps) falls on an epoch's end, so a restart always resumes mid-epoch.
EPOCHS = 19


def partition_cora(workdir: Path) -> Path:
    """Cora's METIS 2-way partition in ``workdir``; returns its partition JSON."""
    out = workdir / "cora2"
    cmd = [sys.executable, "-m", "distgnn.partition.cli", "--dataset", "cora", "--data-dir", str(CORA)]
    subprocess.run([*cmd, "--num-parts", "2", "--out", str(out)], check=True, capture_output=True, timeout=120)
    return next(out.glob("*.json"))


def train_command(checkpoint_dir: Path, run_dir: Path, seed: int = 0, every: int = CHECKPOINT_EVERY) -> list[str]:
    """The training command: a checkpoint every ``every`` steps, resuming from the latest in ``checkpoint_dir``
    if there is one."""
    return [
        sys.executable,
        str(TRAIN),
        "--dataset", "cora", "--data-dir", str(CORA),
        "--epochs", str(EPOCHS), "--batch-size", "8", "--num-threads", "1", "--seed", str(seed), "--quiet",
        "--checkpoint-dir", str(checkpoint_dir), "--checkpoint-every", str(every), "--resume", "auto",
        "--run-dir", str(run_dir), "--metrics-every", "1",
    ]  # fmt: skip


def launcher_argv(part_config: Path, workspace: Path, train: list[str], *flags: str, trainers: int = 1) -> list[str]:
    """``distgnn-launch`` with the ip_config ``workspace/ip.txt``: 1 server and ``trainers`` trainers per machine."""
    argv = [sys.executable, "-m", "distgnn.launch.cli", "--ip-config", "ip.txt", "--part-config", str(part_config)]
    argv += ["--num-trainers", str(trainers), "--num-servers", "1", "--workspace", str(workspace), *flags]
    return [*argv, "--", *train]


def trainer_pid(job_id: str, rank: int) -> int | None:
    """The pid of trainer ``rank`` of job ``job_id`` (the torchrun worker running the example), if it runs."""
    return harness.trainer_pid(job_id, rank, TRAIN)


def wait_for(predicate: Callable[[], object], timeout: float, what: str, alive: Callable[[], bool]) -> float:
    """Poll until ``predicate()`` holds (while ``alive()``); returns the wall time (time.time()) it first did."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if not alive():
            raise AssertionError(f"the job ended before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)
    return time.time()


def checkpoint_exists(checkpoint_dir: Path) -> bool:
    return any((p / "manifest.json").is_file() for p in checkpoint_dir.glob("step-*"))


def result_of(output: str) -> dict:
    """The job's ``RESULT {json}`` (printed once, by rank 0)."""
    lines = [line for line in output.splitlines() if "RESULT " in line]
    assert len(lines) == 1, f"expected one RESULT line, got {lines}"
    return json.loads(lines[0].split("RESULT ", 1)[1])


def step_records(run_dir: Path) -> list[dict]:
    """Rank 0's per-step metrics records, in the order written (a restarted job appends its own)."""
    path = run_dir / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [r for r in records if r["kind"] == "step"]
