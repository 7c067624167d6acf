"""``distgnn-launch --slurm``: run a job inside a Slurm allocation (``salloc``/``sbatch``), without ssh.

The machines are the allocation's nodes, in the order ``scontrol show hostnames
$SLURM_JOB_NODELIST`` lists them: node i is machine i and holds partition i.
Without ``--ip-config`` the launcher writes one (node addresses, one port) into
the run directory, which must be on a filesystem every node reads.

Every process of the plan runs as its own one-task ``srun`` step pinned to its
node (``--nodelist``, ``--overlap`` so that servers and trainers share the
node's allocation). One step per process keeps everything the ssh launcher
relies on: the wrapper of ``remote.py`` reads the token on stdin and stops its
tree when stdin closes, and each process's own exit status reaches the
launcher for the failure report. Standard library only.
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

from distgnn.launch.ip_config import Machine
from distgnn.launch.plan import LaunchError
from distgnn.launch.transport import Command

NODELIST = "SLURM_JOB_NODELIST"


def job_nodes(environ: dict[str, str] | None = None) -> list[str]:
    """The allocation's node names, expanded by ``scontrol show hostnames``."""
    environ = os.environ if environ is None else environ
    nodelist = environ.get(NODELIST)
    if not nodelist:
        raise LaunchError(
            f"--slurm needs ${NODELIST}: run distgnn-launch inside an allocation (sbatch script or salloc)"
        )
    try:
        result = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30, check=False
        )
    except FileNotFoundError:
        raise LaunchError("--slurm needs Slurm's scontrol on PATH (is this a Slurm node?)") from None
    except subprocess.TimeoutExpired:
        raise LaunchError(f"scontrol show hostnames {nodelist} gave no answer within 30 s") from None
    nodes = result.stdout.split()
    if result.returncode != 0 or not nodes:
        said = result.stderr.strip() or "no output"
        raise LaunchError(f"scontrol show hostnames {nodelist} failed (status {result.returncode}): {said}")
    return nodes


def address_of(node: str) -> str:
    """The node's IPv4 address as this host resolves its name."""
    try:
        return socket.getaddrinfo(node, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except socket.gaierror as exc:
        raise LaunchError(
            f"cannot resolve Slurm node {node!r} ({exc.strerror}); pass --ip-config with one address per node"
        ) from None


def write_ip_config(nodes: list[str], port: int, num_servers: int, path: Path) -> list[Machine]:
    """One ip_config line per node, in node order; nodes sharing an address get disjoint port ranges."""
    machines: list[Machine] = []
    for node in nodes:
        ip = address_of(node)
        taken = sum(1 for m in machines if m.ip == ip)
        machines.append(Machine(ip, port + taken * num_servers))
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"{m.ip} {m.port}  # {node}" for m, node in zip(machines, nodes, strict=True)]
    path.write_text(
        "# written by distgnn-launch --slurm: machine i is node i of the allocation\n" + "\n".join(lines) + "\n"
    )
    return machines


class SlurmTransport:
    """Runs each command as a one-task ``srun`` step on the node that holds the machine's address."""

    name = "slurm"

    def __init__(self, workspace: str, machines: list[Machine], nodes: list[str]) -> None:
        if len(machines) != len(nodes):
            raise LaunchError(
                f"the ip_config lists {len(machines)} machines but the allocation has {len(nodes)} nodes "
                f"({', '.join(nodes)}); machine i runs on node i, so the counts must match"
            )
        self.workspace = workspace
        self.node_of = {m.ip: node for m, node in zip(machines, nodes, strict=True)}

    def command(self, host: str, argv: list[str], env: dict[str, str]) -> Command:
        srun = [
            "srun",
            "--nodes=1",
            "--ntasks=1",
            f"--nodelist={self.node_of[host]}",
            "--overlap",  # servers, trainers and cleanup steps share the node's allocation
            "--kill-on-bad-exit=1",
            f"--chdir={self.workspace}",
            "--export=ALL",
            f"--job-name=distgnn-{env.get('DISTGNN_JOB_ID', 'check')}",
        ]
        return Command([*srun, *argv], {**os.environ, **env}, self.workspace)

    def describe_failure(self, host: str, returncode: int, stderr: str) -> str | None:
        if "srun: error" in stderr:
            said = " | ".join(line.strip() for line in stderr.strip().splitlines() if "srun: error" in line)
            return f"srun on node {self.node_of.get(host, host)} failed: {said[-300:]}"
        return None
