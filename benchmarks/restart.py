"""Seconds from ``kill -9`` of a trainer of a real job to that job training again after the launcher's restart.
Prints a table.

    python benchmarks/restart.py --reps 3            # one host: distgnn-launch --local
    python benchmarks/restart.py --reps 3 --netns    # two network-namespace hosts over ssh (root; tests/netns_cluster.py)
    python benchmarks/restart.py --reps 3 --trainers 2 --checkpoint-every 7   # 2 trainers per machine

The job is the one tests/train/test_restart_real_job.py runs (tests/restart_job.py): GraphSAGE on Cora
(examples/graphsage/train_dist.py), ``distgnn-launch --max-restarts 1``, 2 machines x (1 server +
1 trainer; ``--trainers``), a checkpoint every 20 steps (``--checkpoint-every``), ``--resume auto``, a metrics
record per step. The last trainer (on machine 1) is killed as soon as the first checkpoint exists. Times are wall-clock, from the kill to: the launcher's root-cause
line, its "restarting job" line, and the end of the restarted job's first training step (the ``time`` of
rank 0's step record right after the checkpoint's step; it includes the new processes' start-up, the
rendezvous, loading the checkpoint and one step). Each job's result is compared with one uninterrupted run.

    python benchmarks/restart.py --reps 3 --job tgn-memory2   # a job without graph servers (tests/restart_dynamic.py)

``--job`` names a TGN or snapshot job of tests/restart_dynamic.py instead (``tgn-memory2``, ``tgn-epoch2``,
``snapshot-blad``, ``snapshot-contiguous``, ``snapshot-vertex``; 2 machines x 1 trainer, no graph servers,
``distgnn-launch --local --max-restarts 1``): trainer 1 is killed right after the first checkpoint; the table adds
whether the result and the final checkpoint (weights, optimizer, node memory and mailbox) equal the
uninterrupted run's bit for bit.
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

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from launch_progs.harness import FakeJob, assert_nothing_left  # noqa: E402
from launch_progs.harness import trainer_pid as script_pid  # noqa: E402
from netns_cluster import NetnsCluster, free_port, unavailable_reason  # noqa: E402
from restart_dynamic import JOBS, checkpoint_steps, local_job, resumed_step  # noqa: E402
from restart_dynamic import launcher_argv as serverless_argv  # noqa: E402
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


def start(workspace: Path, part_config: Path, cluster: NetnsCluster | None, args: argparse.Namespace, *flags: str):
    """The job on this host (``--local``) or on ``cluster``'s hosts, the launcher in host 0; returns (job, proc)."""
    train = train_command(workspace / "ck", workspace / "run", SEED, args.checkpoint_every)
    if cluster is None:
        base = free_port(span=20)
        job = FakeJob(workspace, ["127.0.0.1", "127.0.0.1"], ports=[base, base + 10])
        argv = launcher_argv(part_config, workspace, train, "--local", *flags, trainers=args.trainers)
        return job, job.start(argv)
    job = FakeJob(workspace, cluster.addresses)
    argv = launcher_argv(part_config, workspace, train, *cluster.ssh_flags(), *flags, trainers=args.trainers)
    return job, job.start(argv, prefix=cluster.exec_prefix(0))


def uninterrupted(workspace: Path, part_config: Path, cluster, args: argparse.Namespace) -> tuple[dict, float]:
    """The job's RESULT without a failure, and its wall seconds."""
    started = time.monotonic()
    job, proc = start(workspace, part_config, cluster, args)
    if proc.wait(timeout=300) != 0:
        raise RuntimeError(f"the uninterrupted job failed:\n{job.stderr()[-3000:]}")
    took = time.monotonic() - started
    assert_nothing_left(job, job.job_id())
    return result_of(job.stdout()), took


def killed_run(workspace: Path, part_config: Path, cluster, args: argparse.Namespace) -> dict:
    checkpoints, run_dir = workspace / "ck", workspace / "run"
    job, proc = start(workspace, part_config, cluster, args, "--max-restarts", "1")
    running = lambda: proc.poll() is None  # noqa: E731
    wait_for(lambda: checkpoint_exists(checkpoints), 300, "the first checkpoint", running)
    victim = 2 * args.trainers - 1
    pid = trainer_pid(job.job_id(), rank=victim)
    if pid is None:
        raise RuntimeError(f"trainer {victim} of job {job.job_id()} is not in the process table")
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


def final_checkpoint(checkpoint_dir: Path) -> dict[str, np.ndarray]:
    directory = checkpoint_dir / f"step-{checkpoint_steps(checkpoint_dir)[-1]:08d}"
    return {p.name: np.load(p) for p in sorted(directory.rglob("*.npy"))}


def same_files(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)


def dynamic_run(workspace: Path, name: str, *flags: str):
    """The job ``name`` of tests/restart_dynamic.py under distgnn-launch --local; returns (job, proc)."""
    train = JOBS[name].command(workspace / "ck", "--run-dir", str(workspace / "run"), "--metrics-every", "1")
    job = local_job(workspace)
    return job, job.start(serverless_argv(workspace, train, *flags))


def dynamic_uninterrupted(workspace: Path, name: str) -> tuple[dict, dict[str, np.ndarray], float]:
    started = time.monotonic()
    job, proc = dynamic_run(workspace, name)
    if proc.wait(timeout=600) != 0:
        raise RuntimeError(f"the uninterrupted job failed:\n{job.stderr()[-3000:]}")
    took = time.monotonic() - started
    assert_nothing_left(job, job.job_id())
    return result_of(job.stdout()), final_checkpoint(workspace / "ck"), took


def dynamic_killed(workspace: Path, name: str) -> dict:
    job, proc = dynamic_run(workspace, name, "--max-restarts", "1")
    running = lambda: proc.poll() is None  # noqa: E731
    wait_for(lambda: checkpoint_steps(workspace / "ck"), 600, "the first checkpoint", running)
    pid = script_pid(job.job_id(), 1, JOBS[name].script)
    if pid is None:
        raise RuntimeError(f"trainer 1 of job {job.job_id()} is not in the process table")
    os.kill(pid, signal.SIGKILL)
    killed = time.time()
    named = wait_for(lambda: ERROR in job.stderr(), 120, "the root-cause line", running)
    restarted = wait_for(lambda: "restarting job" in job.stderr(), 120, "the restart", running)
    if proc.wait(timeout=600) != 0:
        raise RuntimeError(f"the restarted job failed:\n{job.stderr()[-3000:]}")
    assert_nothing_left(job, job.job_id())
    resumed_at = resumed_step(job.stdout())
    steps = step_records(workspace / "run")
    again = max(i for i, r in enumerate(steps) if r["step"] == resumed_at + 1)  # the restarted job's first step
    return {
        "resumed_at": resumed_at,
        "redone": again - resumed_at,
        "named_s": named - killed,
        "restarted_s": restarted - killed,
        "training_s": steps[again]["time"] - killed,
        "result": result_of(job.stdout()),
        "files": final_checkpoint(workspace / "ck"),
    }


def dynamic_main(args: argparse.Namespace) -> None:
    volatile = {"epoch_time_s", "events_per_s", "load_imbalance", "eval_time_s"}  # wall-clock figures
    with tempfile.TemporaryDirectory(prefix="restart-") as tmp:
        tmp = Path(tmp)
        expected, files, plain_s = dynamic_uninterrupted(tmp / "plain", args.job)
        runs = [dynamic_killed(tmp / f"rep{rep}", args.job) for rep in range(args.reps)]
    spec = JOBS[args.job]
    print(
        f"job: {args.job} ({spec.steps} steps, a checkpoint every {spec.checkpoint_every}), 2 machines x 1 trainer, "
        f"no graph servers, distgnn-launch --local --max-restarts 1; uninterrupted: {plain_s:.1f} s wall"
    )
    print("| rep | resumed at step | steps redone | kill -> root-cause line s | kill -> restarting line s "
          "| kill -> first new step done s | same result | same final checkpoint |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for rep, r in enumerate(runs):
        same = {k: v for k, v in r["result"].items() if k not in volatile} == {
            k: v for k, v in expected.items() if k not in volatile
        }
        print(
            f"| {rep} | {r['resumed_at']} | {r['redone']} | {r['named_s']:.2f} | {r['restarted_s']:.2f} "
            f"| {r['training_s']:.2f} | {same} | {same_files(r['files'], files)} |"
        )
    cols = ("named_s", "restarted_s", "training_s")
    print("| median (max) | | | " + " | ".join(cell([r[c] for r in runs]) for c in cols) + " | | |")


def cell(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} ({max(xs):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--netns", action="store_true", help="two network-namespace hosts over ssh (needs root)")
    parser.add_argument("--trainers", type=int, default=1, help="trainers per machine")
    parser.add_argument("--checkpoint-every", type=int, default=20, help="steps between checkpoints")
    parser.add_argument(
        "--job", default="graphsage", choices=["graphsage", *JOBS], help="the job (graphsage: on Cora with servers)"
    )
    args = parser.parse_args()
    if args.job != "graphsage":
        if args.netns or args.trainers != 1:
            parser.error(f"--job {args.job} runs on one host with 1 trainer per machine")
        dynamic_main(args)
        return
    if args.netns and (reason := unavailable_reason()):
        parser.error(f"--netns: {reason}")
    cluster = NetnsCluster(2) if args.netns else None
    try:
        with tempfile.TemporaryDirectory(prefix="restart-") as tmp:
            tmp = Path(tmp)
            part_config = partition_cora(tmp)
            expected, plain_s = uninterrupted(tmp / "plain", part_config, cluster, args)
            runs = [killed_run(tmp / f"rep{rep}", part_config, cluster, args) for rep in range(args.reps)]
    finally:
        if cluster is not None:
            cluster.close()
    where = "2 netns hosts over ssh" if args.netns else "one host (--local)"
    shape = f"2 machines x (1 server + {args.trainers} trainers), a checkpoint every {args.checkpoint_every} steps"
    print(f"job: GraphSAGE on Cora, distgnn-launch --max-restarts 1, {shape}, {where}")
    print(
        f"uninterrupted: {plain_s:.1f} s wall, test_acc {expected['test_acc']:.4f}, val_acc {expected['val_acc']:.4f}"
    )
    print("| rep | resumed at step | steps redone | kill -> root-cause line s | kill -> restarting line s "
          "| kill -> first new step done s | test_acc - uninterrupted | val_acc - uninterrupted | same train_loss |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for rep, r in enumerate(runs):
        d_test = r["result"]["test_acc"] - expected["test_acc"]
        d_val = r["result"]["val_acc"] - expected["val_acc"]
        same_loss = r["result"]["train_loss"] == expected["train_loss"]
        print(
            f"| {rep} | {r['resumed_at']} | {r['redone']} | {r['named_s']:.2f} | {r['restarted_s']:.2f} "
            f"| {r['training_s']:.2f} | {d_test:+.4f} | {d_val:+.4f} | {same_loss} |"
        )
    cols = ("named_s", "restarted_s", "training_s")
    print("| median (max) | | | " + " | ".join(cell([r[c] for r in runs]) for c in cols) + " | | | |")
    print(
        json.dumps(
            {
                "reps": args.reps,
                "netns": args.netns,
                "trainers": args.trainers,
                "training_s": [round(r["training_s"], 3) for r in runs],
            }
        )
    )


if __name__ == "__main__":
    main()
