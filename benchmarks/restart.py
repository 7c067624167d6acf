"""Seconds from ``kill -9`` of a trainer of a real job to that job training again after the launcher's restart.
Prints a table.

    python benchmarks/restart.py --reps 3            # one host: distgnn-launch --local
    python benchmarks/restart.py --reps 3 --netns    # two network-namespace hosts over ssh (root; tests/netns_cluster.py)

The job is the one tests/test_restart_real_job.py runs (tests/restart_job.py): GraphSAGE on Cora
(examples/graphsage/train_dist.py), ``distgnn-launch --max-restarts 1``, 2 machines x (1 server +
1 trainer), a checkpoint every 20 steps, ``--resume auto``, a metrics record per step. Trainer 1 is killed
as soon as the first checkpoint exists. Times are wall-clock, from the kill to: the launcher's root-cause
line, its "restarting job" line, and the end of the restarted job's first training step (the ``time`` of
rank 0's step record right after the checkpoint's step; it includes the new processes' start-up, the
rendezvous, loading the checkpoint and one step). Each job's result is compared with one uninterrupted run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from launch_progs.harness import FakeJob, assert_nothing_left  # noqa: E402
from netns_cluster import NetnsCluster, free_port, unavailable_reason  # noqa: E402
from restart_job import (  # noqa: E402
    checkpoint_exists,
    launcher_argv,
    partition_cora,
    result_of,
    step_records,
    train_command,
    trainer_pid,
    wait_for,
)

ERROR = "distgnn-launch: error:"
SEED = 7


def start(workspace: Path, part_config: Path, cluster: NetnsCluster | None, *flags: str):
    """The job on this host (``--local``) or on ``cluster``'s hosts, the launcher in host 0; returns (job, proc)."""
    train = train_command(workspace / "ck", workspace / "run", SEED)
    if cluster is None:
        base = free_port(span=20)
        job = FakeJob(workspace, ["127.0.0.1", "127.0.0.1"], ports=[base, base + 10])
        return job, job.start(launcher_argv(part_config, workspace, train, "--local", *flags))
    job = FakeJob(workspace, cluster.addresses)
    argv = launcher_argv(part_config, workspace, train, *cluster.ssh_flags(), *flags)
    return job, job.start(argv, prefix=cluster.exec_prefix(0))


def uninterrupted(workspace: Path, part_config: Path, cluster: NetnsCluster | None) -> tuple[dict, float]:
    """The job's RESULT without a failure, and its wall seconds."""
    started = time.monotonic()
    job, proc = start(workspace, part_config, cluster)
    if proc.wait(timeout=300) != 0:
        raise RuntimeError(f"the uninterrupted job failed:\n{job.stderr()[-3000:]}")
    took = time.monotonic() - started
    assert_nothing_left(job, job.job_id())
    return result_of(job.stdout()), took


def killed_run(workspace: Path, part_config: Path, cluster: NetnsCluster | None) -> dict:
    checkpoints, run_dir = workspace / "ck", workspace / "run"
    job, proc = start(workspace, part_config, cluster, "--max-restarts", "1")
    running = lambda: proc.poll() is None  # noqa: E731
    wait_for(lambda: checkpoint_exists(checkpoints), 300, "the first checkpoint", running)
    pid = trainer_pid(job.job_id(), rank=1)
    if pid is None:
        raise RuntimeError(f"trainer 1 of job {job.job_id()} is not in the process table")
    os.kill(pid, signal.SIGKILL)
    killed = time.time()
    named = wait_for(lambda: ERROR in job.stderr(), 120, "the root-cause line", running)
    restarted = wait_for(lambda: "restarting job" in job.stderr(), 120, "the restart", running)
    if proc.wait(timeout=300) != 0:
        raise RuntimeError(f"the restarted job failed:\n{job.stderr()[-3000:]}")
    assert_nothing_left(job, job.job_id())
    (line,) = [x for x in job.stdout().splitlines() if x.startswith("[0/trainer/0] resumed from ")]
    resumed_at = int(line.rsplit("(step ", 1)[1].rstrip(")"))
    steps = step_records(run_dir)
    again = max(i for i, r in enumerate(steps) if r["step"] == resumed_at + 1)  # the restarted job's first step
    return {
        "resumed_at": resumed_at,
        "redone": again - resumed_at,  # steps done before the kill that the restarted job does again
        "named_s": named - killed,
        "restarted_s": restarted - killed,
        "training_s": steps[again]["time"] - killed,
        "result": result_of(job.stdout()),
    }


def cell(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} ({max(xs):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--netns", action="store_true", help="two network-namespace hosts over ssh (needs root)")
    args = parser.parse_args()
    if args.netns and (reason := unavailable_reason()):
        parser.error(f"--netns: {reason}")
    cluster = NetnsCluster(2) if args.netns else None
    try:
        with tempfile.TemporaryDirectory(prefix="restart-") as tmp:
            tmp = Path(tmp)
            part_config = partition_cora(tmp)
            expected, plain_s = uninterrupted(tmp / "plain", part_config, cluster)
            runs = [killed_run(tmp / f"rep{rep}", part_config, cluster) for rep in range(args.reps)]
    finally:
        if cluster is not None:
            cluster.close()
    where = "2 netns hosts over ssh" if args.netns else "one host (--local)"
    print(f"job: GraphSAGE on Cora, distgnn-launch --max-restarts 1, 2 machines x (1 server + 1 trainer), {where}")
    print(
        f"uninterrupted: {plain_s:.1f} s wall, test_acc {expected['test_acc']:.4f}, val_acc {expected['val_acc']:.4f}"
    )
    print("| rep | resumed at step | steps redone | kill -> root-cause line s | kill -> restarting line s "
          "| kill -> first new step done s | test_acc - uninterrupted | val_acc - uninterrupted |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for rep, r in enumerate(runs):
        d_test = r["result"]["test_acc"] - expected["test_acc"]
        d_val = r["result"]["val_acc"] - expected["val_acc"]
        print(
            f"| {rep} | {r['resumed_at']} | {r['redone']} | {r['named_s']:.2f} | {r['restarted_s']:.2f} "
            f"| {r['training_s']:.2f} | {d_test:+.4f} | {d_val:+.4f} |"
        )
    cols = ("named_s", "restarted_s", "training_s")
    print("| median (max) | | | " + " | ".join(cell([r[c] for r in runs]) for c in cols) + " | | |")
    print(json.dumps({"reps": args.reps, "netns": args.netns, "training_s": [round(r["training_s"], 3) for r in runs]}))


if __name__ == "__main__":
    main()
