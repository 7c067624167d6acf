"""Seconds from a ``kill -9`` to ``distgnn-launch``'s root-cause line and to its clean exit, and from a
failure to training again with ``--max-restarts``. Prints a table.

    python benchmarks/launch_failure.py --reps 3            # the launcher tests' stand-in programs
    python benchmarks/launch_failure.py --reps 3 --real     # GraphSAGE on Cora (examples/graphsage/train_dist.py)

Both run ``distgnn-launch --local`` with 2 machines x (1 server + 2 trainers) on this host. "Clean" means no
process of the job and no /dev/shm file of the job is left when the launcher has exited (checked each time).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from launch_progs.harness import FakeJob, assert_nothing_left, job_pids  # noqa: E402
from netns_cluster import free_port  # noqa: E402

CORA = ROOT.parent / "shared" / "data" / "planetoid"
TRAIN = ROOT / "examples" / "graphsage" / "train_dist.py"
ERROR = "distgnn-launch: error:"


def wait_for(predicate, timeout: float, what: str) -> float:
    """Poll until ``predicate()`` holds; returns the time.monotonic() it first did."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)
    return time.monotonic()


def new_job(workspace: Path) -> FakeJob:
    base = free_port(span=20)
    return FakeJob(workspace, ["127.0.0.1", "127.0.0.1"], ports=[base, base + 10])


def real_argv(job: FakeJob, part_config: Path, *flags: str) -> list[str]:
    train = [str(TRAIN), "--dataset", "cora", "--data-dir", str(CORA), "--epochs", "100000", "--max-batches", "2"]
    argv = [sys.executable, "-m", "distgnn.launch.cli", "--ip-config", "ip.txt", "--part-config", str(part_config)]
    argv += ["--num-trainers", "2", "--workspace", str(job.workspace), "--local", "--extra-env", "OMP_NUM_THREADS=1"]
    argv += flags
    return [*argv, "--", sys.executable, *train]


def process_of(job_id: str, role: str, machine: int) -> int:
    """The pid of a process of the job by its role (server or a torchrun worker) and machine."""
    for pid in job_pids(job_id):
        try:
            env = dict(e.split("=", 1) for e in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in e)
            cmdline = Path(f"/proc/{pid}/cmdline").read_text()
        except OSError:
            continue
        if env.get("DISTGNN_MACHINE_ID") != str(machine) or env.get("DISTGNN_ROLE") != role:
            continue
        if role == "server" and "distgnn.server" in cmdline and "distgnn.launch" not in cmdline:
            return pid
        if role == "trainer" and env.get("LOCAL_RANK") == "0" and "RANK" in env and "train_dist.py" in cmdline:
            return pid
    raise RuntimeError(f"no {role} of machine {machine} in job {job_id}")


def kill_run(workspace: Path, victim: str, real: bool, part_config: Path | None) -> tuple[float, float, str]:
    job = new_job(workspace)
    if real:
        proc = job.start(real_argv(job, part_config))
        wait_for(lambda: job.stdout().count("epoch") >= 2, 180, "training to start")
        pid = process_of(job.job_id(), victim, machine=1)
    else:
        proc = job.start(job.argv("--local", mode="sleep"))
        job.wait_running(num_servers=2, num_trainers=4, proc=proc)
        pid = job.pids()["server-m1-s0" if victim == "server" else "trainer-r2"]
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    named = wait_for(lambda: ERROR in job.stderr(), 120, "the root-cause line")
    proc.wait(timeout=120)
    ended = time.monotonic()
    assert_nothing_left(job, job.job_id(), timeout=0.5)
    (line,) = [x for x in job.stderr().splitlines() if x.startswith(ERROR)]
    return named - killed, ended - killed, line


def restart_run(workspace: Path) -> float:
    """Fake trainers: rank 1 fails on the first start; seconds from its failure to every trainer started again."""
    job = new_job(workspace)
    proc = job.start(job.argv("--local", "--max-restarts", "1", mode="crash_once", env=("FAKE_RAISE_RANK=1",)))
    failed = None
    while proc.poll() is None:
        if failed is None and ERROR in job.stderr():
            failed = time.time()
        time.sleep(0.02)
    assert proc.returncode == 0, job.stderr()
    reports = job.trainer_reports()
    assert {r["restart_count"] for r in reports.values()} == {1}
    return max(r["started_at"] for r in reports.values()) - failed


def partition_cora(workdir: Path) -> Path:
    out = workdir / "cora2"
    cmd = [sys.executable, "-m", "distgnn.partition.cli", "--dataset", "cora", "--data-dir", str(CORA)]
    subprocess.run([*cmd, "--num-parts", "2", "--out", str(out)], check=True, capture_output=True)
    return next(out.glob("*.json"))


def cell(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} ({max(xs):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--real", action="store_true", help="GraphSAGE on Cora instead of the stand-in programs")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="launch-failure-") as tmp:
        tmp = Path(tmp)
        part_config = partition_cora(tmp) if args.real else None
        for victim in ("server", "trainer"):
            named, ended, lines = [], [], set()
            for rep in range(args.reps):
                n, e, line = kill_run(tmp / f"{victim}{rep}", victim, args.real, part_config)
                named.append(n)
                ended.append(e)
                lines.add(line.split("(partition")[0])
            rows.append((f"kill -9 {victim} of machine 1", named, ended, " / ".join(sorted(lines))))
        again = [] if args.real else [restart_run(tmp / f"restart{rep}") for rep in range(args.reps)]
    print(f"job: {'GraphSAGE on Cora' if args.real else 'stand-in programs'}, 2 machines x (1 server + 2 trainers)")
    print("| event | to root-cause line, median (max) s | to clean exit, median (max) s | root-cause line |")
    print("|---|---|---|---|")
    for what, named, ended, line in rows:
        print(f"| {what} | {cell(named)} | {cell(ended)} | {line} |")
    if again:
        print(
            f"\ntrainer fails with --max-restarts 1: root-cause line -> all 4 trainers started again: {cell(again)} s"
        )
    print(json.dumps({"reps": args.reps, "real": args.real}))


if __name__ == "__main__":
    main()
