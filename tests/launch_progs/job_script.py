"""A training script in the shape of the examples, for tests of distgnn.train.job.

Each trainer prints ``TRAINER rank world seeds inference_nodes`` on stdout; ``--fail-rank R`` makes
trainer R write a line on stderr and exit with code 3 before joining the job (in the first ``--fail-times``
attempts of a job started again by ``--max-restarts``; ``--kill-rank R``: SIGKILL itself), ``--sleep S`` keeps every trainer busy for S seconds after joining.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from distgnn.data.datasets import add_dataset_args
from distgnn.partition.prepare import job_partition
from distgnn.train import job


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    add_dataset_args(p)
    job.add_job_args(p)
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--fail-times", type=int, default=1)
    p.add_argument("--kill-rank", type=int, default=-1)
    p.add_argument("--sleep", type=float, default=0.0)
    args = p.parse_args(argv)
    job.log_to_stderr()
    if args.local:
        return job.run_local(__file__, argv, args, job_partition(args))
    rank, attempt = int(os.environ.get("RANK", "0")), int(os.environ.get("DISTGNN_RESTART_COUNT", "0"))
    if rank == args.fail_rank and attempt < args.fail_times:
        print(f"trainer {rank} gives up on purpose in attempt {attempt}", file=sys.stderr, flush=True)
        return 3
    if rank == args.kill_rank:
        os.kill(os.getpid(), signal.SIGKILL)
    with job.start_trainer(args) as trainer:
        seeds = trainer.seeds("train_mask")
        nodes = trainer.inference_nodes()
        # One write per line: print() may write the text and its newline separately, and four trainers share
        # this stdout.
        sys.stdout.write(f"TRAINER {trainer.rank} {trainer.world_size} {len(seeds)} {len(nodes)}\n")
        sys.stdout.flush()
        time.sleep(args.sleep)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
