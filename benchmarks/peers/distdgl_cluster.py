"""A simulated 2-machine DistDGL 1.1.3 job on this host, for benchmarks that run DistDGL beside distgnn.

DistDGL names its shared memory by graph and tensor name only, so two of its "machines"
cannot share one /dev/shm: each simulated machine (server + trainer) runs in a private mount
namespace with its own tmpfs on /dev/shm (``unshare -m``; needs root), on its own loopback
address (127.0.0.1, 127.0.0.2), and the trainer is told its machine by narrowing DGL's
local-address list to that address.

A benchmark script re-runs itself in roles: the main process calls :func:`run_machines`, which
starts ``SCRIPT ARGV --role=dgl-machine --machine=M --master-port=P`` per machine; that role
calls :func:`machine`, which starts ``--role=dgl-server`` (:func:`serve`) and ``--role=dgl-trainer``
(which calls :func:`join_as_trainer` first).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

DGL_IPS = ("127.0.0.1", "127.0.0.2")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_for_result(cmd: list[str], label: str, **kw) -> dict:
    """Run ``cmd``, echo its stdout to stderr with a ``[label]`` prefix, return its ``RESULT {json}``."""
    print(f"[{label}] {' '.join(cmd)}", file=sys.stderr, flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, **kw)
    result = None
    for line in proc.stdout:
        sys.stderr.write(f"[{label}] {line}")
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT ") :])
    if proc.wait() != 0 or result is None:
        raise SystemExit(
            f"error: {label} run failed (exit code {proc.returncode}, result {'seen' if result else 'missing'})"
        )
    return result


def run_machines(script: str, argv: list[str], ip_config: Path, env: dict | None = None) -> dict:
    """Start both simulated machines (``script argv --role=dgl-machine``); machine 0's trainer prints the result."""
    ports = [free_port(), free_port()]
    ip_config.write_text("".join(f"{ip} {port}\n" for ip, port in zip(DGL_IPS, ports, strict=True)))
    master_port = free_port()
    machines = []
    for m in range(2):
        inner = [sys.executable, script, *argv, "--role=dgl-machine", f"--machine={m}", f"--master-port={master_port}"]
        # A private /dev/shm per simulated machine (DistDGL's segment names are per graph and tensor only).
        shell = 'mount -t tmpfs -o size=16g tmpfs /dev/shm && exec "$@"'
        machines.append(["unshare", "-m", "--propagation", "private", "sh", "-c", shell, "sh", *inner])
    procs = []
    env = {**os.environ, **(env or {})}
    try:
        procs = [subprocess.Popen(machines[1], stdout=subprocess.DEVNULL, env=env)]
        return run_for_result(machines[0], "distdgl", env=env)
    finally:
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()


def machine(
    script: str,
    argv: list[str],
    machine_id: int,
    master_port: int,
    part_config: Path,
    ip_config: Path,
    num_workers: int,
) -> int:
    """One simulated DGL machine: its server and its trainer (inside the machine's mount namespace)."""
    base = {
        **os.environ,
        "DGL_DIST_MODE": "distributed",
        "DGL_IP_CONFIG": str(ip_config),
        "DGL_NUM_SERVER": "1",
        "DGL_NUM_CLIENT": str(2 * (1 + num_workers)),
        "DGL_CONF_PATH": str(part_config),
        "DGL_GRAPH_FORMAT": "csc",
        "OMP_NUM_THREADS": "1",
    }
    server = subprocess.Popen(
        [sys.executable, script, *argv, "--role=dgl-server"],
        env={**base, "DGL_ROLE": "server", "DGL_SERVER_ID": str(machine_id)},
    )
    trainer_env = {
        **base,
        "DGL_ROLE": "client",
        "DGL_NUM_SAMPLER": str(num_workers),
        "DGL_GROUP_ID": "0",
        "RANK": str(machine_id),
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(master_port),
    }
    trainer = subprocess.Popen([sys.executable, script, *argv, "--role=dgl-trainer"], env=trainer_env)
    code = trainer.wait()
    try:
        server.wait(60)
    except subprocess.TimeoutExpired:
        server.kill()
    return code


def serve(ip_config: Path) -> int:
    import dgl

    dgl.distributed.initialize(str(ip_config))  # a server serves inside initialize and exits the process
    return 0


def join_as_trainer(machine_id: int, ip_config: Path) -> None:
    """Initialise DistDGL as machine ``machine_id``'s trainer, then torch.distributed (gloo), one torch thread."""
    import dgl
    import torch
    import torch.distributed as dist
    from dgl.distributed import rpc_client

    my_ip = DGL_IPS[machine_id]
    # DistDGL finds its machine by matching local addresses against ip_config: narrow them to ours.
    rpc_client.local_ip4_addr_list = lambda: {my_ip}
    torch.set_num_threads(1)
    dgl.distributed.initialize(str(ip_config))
    dist.init_process_group("gloo")
