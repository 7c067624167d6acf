"""A trainer that leaves the job leaves nothing of torch.distributed running: after ``destroy_process_group``
the gloo backend's threads (its work threads and its TCP loop) are gone, so the interpreter's exit never tears
down a live backend while the peers close their sockets.

torch's compile stack, imported on first use by ``torch.optim`` optimizers and DDP, keeps a reference to every
process group that exists when it is first imported; a group made before that import then survives
``destroy_process_group`` with its threads running into the exit. ``join_process_group`` is the one place the
job's group is made, so the check runs through it, with an optimizer built after it as every training loop does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from netns_cluster import free_port

# One trainer of a two-trainer job: join through the library, build an optimizer (the first torch.optim use in
# the process), exchange a tensor both ways and by collective, leave, then list the threads still running.
TRAINER = textwrap.dedent(
    """
    import argparse, os, sys
    import torch
    import torch.distributed as dist
    from distgnn.train import job

    p = argparse.ArgumentParser()
    job.add_job_args(p)
    args = p.parse_args(["--num-threads", "1"])
    job.join_process_group(args)
    model = torch.nn.Linear(4, 2)
    torch.optim.Adam(model.parameters(), lr=0.01)
    rank = dist.get_rank()
    if rank == 0:
        dist.isend(torch.ones(8), 1).wait()
    else:
        buf = torch.empty(8)
        dist.recv(buf, 0)
    t = torch.ones(3)
    dist.all_reduce(t)
    dist.barrier()
    dist.destroy_process_group()
    names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
    print("THREADS " + ",".join(sorted(names)), flush=True)
    """
)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs /proc to list a process's threads")
def test_leaving_the_job_ends_every_backend_thread(tmp_path) -> None:
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE="2",
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=180)[0] for p in procs]
    for rank, (proc, out) in enumerate(zip(procs, outs, strict=True)):
        assert proc.returncode == 0, f"trainer {rank} exited {proc.returncode}"
        line = next(x for x in out.splitlines() if x.startswith("THREADS "))
        left = [name for name in line[len("THREADS ") :].split(",") if "gloo" in name or "tcpstore" in name]
        assert left == [], f"trainer {rank}: threads still running after destroy_process_group: {left}"
