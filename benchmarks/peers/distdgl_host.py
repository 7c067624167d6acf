"""DistDGL 1.1.3's simulated machines on this host for the heterogeneous benchmarks (any machine count);
running a job for its ``RESULT`` line comes from ``distdgl_cluster``.

DistDGL names its shared memory by graph and tensor name only, so two of its "machines" cannot share one
/dev/shm: each simulated DGL machine (server + trainer) runs in a private mount namespace with its own tmpfs
on /dev/shm (``unshare -m``; needs root), on its own loopback address (127.0.0.1, 127.0.0.2, ...), and a
trainer is told its machine by narrowing DGL's local-address list to that address
(:func:`pin_dgl_machine`).
"""

from __future__ import annotations

import subprocess

from peers.distdgl_cluster import free_port, run_for_result  # noqa: F401  (re-exported for the benchmarks)

DGL_IPS = ("127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4")


def in_private_shm(inner: list[str], shm_size: str = "16g") -> list[str]:
    """``inner`` wrapped to run in a private mount namespace with its own tmpfs on /dev/shm."""
    script = f'mount -t tmpfs -o size={shm_size} tmpfs /dev/shm && exec "$@"'
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *inner]


def run_simulated_machines(machines: list[list[str]], label: str, env: dict) -> dict:
    """Start every machine's command (machine 0's stdout carries the RESULT); wait for all; return it."""
    procs = []
    try:
        procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env=env) for cmd in machines[1:]]
        return run_for_result(machines[0], label, env=env)
    finally:
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def pin_dgl_machine(machine: int) -> None:
    """Make DistDGL in this process believe it runs on simulated machine ``machine`` (call before initialize)."""
    from dgl.distributed import rpc_client

    my_ip = DGL_IPS[machine]
    rpc_client.local_ip4_addr_list = lambda: {my_ip}
