"""Memory and start-up of N temporal trainers on one machine: each its own stream and CSR, or one shared copy.

Starts N trainer processes at once on this host, as one machine of a job. Each runs the temporal job's own
start-up (``distgnn.temporal.job.prepare``: read or generate the stream, build or map its time-sorted CSR),
builds the TGN and its runner with the example's defaults and trains a few batches, then reports ready and
waits. Once all N are ready, this script reads every trainer's ``/proc/PID/smaps_rollup``: RSS (shared pages
counted in full by every process that maps them) and PSS (shared pages split among the processes mapping
them; the sum over the trainers is the machine's memory for them). Then it stops them and removes the job's
shared memory.

* ``private``: no job id in the environment: every trainer reads the stream and builds the CSR itself (what
  every trainer did before the shared copy).
* ``shared``: ``DISTGNN_JOB_ID`` and ``DISTGNN_MACHINE_ID`` set, as ``--local`` and ``distgnn-launch`` set
  them: the first trainer builds the stream and CSR into shared memory, the others map them.

Start-up is the wall time from starting the N processes until the last one is ready (Python and torch
imports included), and the time ``prepare`` took in the slowest trainer; with ``--repeat R`` the two modes
alternate R times and the times are medians.

    flock /tmp/distgnn-heavy.lock python benchmarks/temporal_shm.py --dataset synthetic-events:100000:2000000 \\
        --trainers 2,4 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

READY = "READY "


def worker(argv: list[str]) -> int:
    """One trainer's start-up; prints ``READY {json}`` and waits for stdin to close."""
    start = time.monotonic()
    import torch

    from distgnn.nn.temporal import TGN
    from distgnn.temporal import job as temporal_job
    from distgnn.temporal.train import TGNRunner, train_epoch
    from distgnn.train import job

    parser = argparse.ArgumentParser()
    temporal_job.add_temporal_args(parser)
    job.add_job_args(parser)
    parser.add_argument("--batches", type=int, default=20)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    imported = time.monotonic()
    plan = temporal_job.prepare(args)
    prepared = time.monotonic()
    events = plan.events
    model = TGN(events.num_nodes, events.feat_dim, args.memory_dim, args.time_dim, args.embedding_dim, args.heads)
    runner = TGNRunner(model, events, plan.csr, torch.device("cpu"), args.neighbors, seed=args.seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, foreach=True)
    train_epoch(runner, plan.train_batches[: args.batches], optimizer)
    report = {"pid": os.getpid(), "import_s": imported - start, "prepare_s": prepared - imported}
    print(READY + json.dumps(report), flush=True)
    sys.stdin.read()  # until the benchmark has measured every trainer
    return 0


def rollup(pid: int) -> dict[str, int]:
    """kB figures of ``/proc/PID/smaps_rollup`` (Rss, Pss, Pss_Anon, Pss_Shmem, ...)."""
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            fields = line.split()
            if len(fields) == 3 and fields[2] == "kB":
                out[fields[0].rstrip(":")] = int(fields[1])
    return out


def run(dataset: str, trainers: int, shared: bool, batches: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("DISTGNN_JOB_ID", "DISTGNN_MACHINE_ID")}
    env["OMP_NUM_THREADS"] = "1"
    job_id = f"bench{secrets.token_hex(4)}"
    if shared:
        env.update(DISTGNN_JOB_ID=job_id, DISTGNN_MACHINE_ID="0")
    flags = ["--dataset", dataset, "--num-parts", "1", "--trainers-per-machine", str(trainers)]
    flags += ["--memory-parallelism", str(trainers), "--batches", str(batches)]
    start = time.monotonic()
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", *flags],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(trainers)
    ]
    try:
        reports = []
        for proc in procs:
            line = proc.stdout.readline()
            if not line.startswith(READY):
                raise RuntimeError(f"trainer pid {proc.pid} ended before it was ready (exit {proc.wait()})")
            reports.append(json.loads(line[len(READY) :]))
        startup = time.monotonic() - start
        memory = [rollup(proc.pid) for proc in procs]
        shm_kb = sum(p.stat().st_size for p in _segments(job_id)) // 1024
    finally:
        for proc in procs:
            proc.stdin.close()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()  # still starting: it would not read its stdin before it is ready
                proc.wait()
        for path in _segments(job_id):
            path.unlink(missing_ok=True)
    return {
        "mode": "shared" if shared else "private",
        "trainers": trainers,
        "startup_s": startup,
        "prepare_s": max(r["prepare_s"] for r in reports),
        "rss_mb": [m["Rss"] / 1024 for m in memory],
        "pss_mb": [m["Pss"] / 1024 for m in memory],
        "shm_mb": shm_kb / 1024,
    }


def _segments(job_id: str) -> list[Path]:
    return list(Path("/dev/shm").glob(f"distgnn-{job_id}-*"))


def main() -> int:
    if sys.argv[1:2] == ["--worker"]:
        return worker(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="synthetic-events:100000:2000000")
    parser.add_argument("--trainers", default="2,4", help="trainer counts, comma-separated")
    parser.add_argument("--batches", type=int, default=20, help="training batches each trainer runs before measuring")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each case; times are their median")
    args = parser.parse_args()
    # SIGTERM (timeout, the lead's kill) unwinds like Ctrl-C: each run stops its trainers and removes its segments.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    print(
        f"{args.dataset}, {args.batches} training batches per trainer, one torch thread each, "
        f"median of {args.repeat} run(s)\n",
        flush=True,
    )
    print(
        "| trainers | event graph | start-up s (all ready) | prepare s (slowest) | RSS per trainer MB | "
        "PSS per trainer MB | PSS sum MB | /dev/shm MB |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for trainers in (int(t) for t in args.trainers.split(",")):
        runs: dict[bool, list[dict]] = {False: [], True: []}
        for _ in range(args.repeat):
            for shared in (False, True):  # alternating, so the load of a shared box falls on both
                runs[shared].append(run(args.dataset, trainers, shared, args.batches))
        for shared in (False, True):
            r = dict(runs[shared][0])  # memory: the first run's (it repeats to within a few MB)
            r["startup_s"] = statistics.median(x["startup_s"] for x in runs[shared])
            r["prepare_s"] = statistics.median(x["prepare_s"] for x in runs[shared])
            rss = "/".join(f"{x:.0f}" for x in r["rss_mb"])
            pss = "/".join(f"{x:.0f}" for x in r["pss_mb"])
            print(
                f"| {trainers} | {r['mode']} | {r['startup_s']:.1f} | {r['prepare_s']:.1f} | {rss} | {pss} | "
                f"{sum(r['pss_mb']):.0f} | {r['shm_mb']:.0f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
