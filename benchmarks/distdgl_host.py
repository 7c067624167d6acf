"""What the DistDGL-vs-distgnn training benchmarks share: running a job for its ``RESULT`` line, and
DistDGL 1.1.3's simulated machines on this host.

DistDGL names its shared memory by graph and tensor name only, so two of its "machines" cannot share one
/dev/shm: each simulated DGL machine (server + trainer) runs in a private mount namespace with its own tmpfs
on /dev/shm (``unshare -m``; needs root), on its own loopback address (127.0.0.1, 127.0.0.2, ...), and a
trainer is told its machine by narrowing DGL's local-address list to that address
(:func:`pin_dgl_machine`).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys

DGL_IPS = ("127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4")


def run_for_result(cmd: list[str], label: str, **kw) -> dict:
    """Run ``cmd``, echo its stdout to stderr prefixed by ``label``, and return its ``RESULT {json}``."""
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
