"""Checks that run before anything starts: every problem found here is a clear error and no process runs.

Local checks (ip_config lines, partition count when a partition is given, port ranges, ``--local``
addresses), then one short command per machine, in parallel, through the same
transport the job will use: ssh reachability and authentication, the workspace,
the interpreter, distgnn and torch importable, the servers' ports free, a
free rendezvous port on machine 0, and the network interface holding each
machine's ip_config address.
"""

from __future__ import annotations

import json
import os
import socket
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from distgnn.launch.ip_config import IpConfigError, Machine, read_ip_config
from distgnn.launch.plan import LaunchError, LaunchOptions
from distgnn.launch.transport import SSH_CONNECT_TIMEOUT_S, run_short

CHECK_TIMEOUT_S = SSH_CONNECT_TIMEOUT_S + 25


def read_machines(opts: LaunchOptions) -> list[Machine]:
    """The ip_config's machines, checked against the partition count (when there is a partition) and each
    other's ports."""
    try:
        machines = read_ip_config(opts.ip_config)
    except IpConfigError as exc:
        raise LaunchError(str(exc)) from None
    num_parts = len(machines) if opts.part_config is None else read_num_parts(opts.part_config)
    if num_parts != len(machines):
        raise LaunchError(
            f"{opts.ip_config} lists {len(machines)} machines but {opts.part_config} has {num_parts} partitions; "
            "machine i holds partition i, so the counts must match (re-partition or edit ip_config)"
        )
    check_port_ranges(machines, opts.num_servers)
    if opts.local:
        for i, machine in enumerate(machines):
            if not is_local_address(machine.ip):
                raise LaunchError(
                    f"--local runs every machine on this host, but machine {i} of {opts.ip_config} is {machine.ip}, "
                    "which is not an address of this host (use 127.0.0.1 with distinct ports)"
                )
    return machines


def read_num_parts(part_config: str) -> int:
    try:
        with open(part_config) as f:
            meta = json.load(f)
    except OSError as exc:
        raise LaunchError(f"cannot read the partition config {part_config}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise LaunchError(f"{part_config} is not JSON ({exc}); pass the <graph>.json the partitioner wrote") from None
    num_parts = meta.get("num_parts") if isinstance(meta, dict) else None
    if not isinstance(num_parts, int) or num_parts < 1:
        raise LaunchError(f"{part_config} has no positive integer 'num_parts'; is it a distgnn partition config?")
    return num_parts


def check_port_ranges(machines: list[Machine], num_servers: int) -> None:
    """Machines sharing an address need disjoint server port ranges [PORT, PORT + servers)."""
    for i, a in enumerate(machines):
        if a.port + num_servers - 1 > 65535:
            raise LaunchError(f"machine {i} ({a.ip}): ports {a.port}..{a.port + num_servers - 1} exceed 65535")
        for j in range(i):
            b = machines[j]
            if a.ip == b.ip and abs(a.port - b.port) < num_servers:
                raise LaunchError(
                    f"machines {j} and {i} are both {a.ip} with ports {b.port} and {a.port}: with {num_servers} "
                    f"servers per machine each needs {num_servers} consecutive ports, so space the ports further apart"
                )


def is_local_address(ip: str) -> bool:
    """Whether ``ip`` belongs to this host (binding to it succeeds)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((ip, 0))
        except OSError:
            return False
    return True


@dataclass(frozen=True)
class MachineFacts:
    """What the preflight learned: the rendezvous port (free on machine 0), each machine's interface."""

    master_port: int
    interfaces: tuple[str | None, ...]


def check_machines(machines: list[Machine], transport, python: str, num_servers: int) -> MachineFacts:
    """Run the preflight on every machine in parallel."""

    def check_one(machine_id: int):
        machine = machines[machine_id]
        ports = [str(machine.port + j) for j in range(num_servers)]
        argv = [python, "-m", "distgnn.launch.remote", "check", "--address", machine.ip, "--ports", *ports]
        if machine_id == 0:
            argv.append("--free-port")
        return run_short(transport, machine.ip, argv, CHECK_TIMEOUT_S)

    with ThreadPoolExecutor(max_workers=min(16, len(machines))) as pool:
        results = list(pool.map(check_one, range(len(machines))))
    problems = []
    reports = []
    for machine_id, (machine, result) in enumerate(zip(machines, results, strict=True)):
        where = f"machine {machine_id} ({machine.ip})"
        ssh_problem = transport.describe_failure(machine.ip, result.returncode, result.stderr)
        if ssh_problem:
            problems.append(f"{where}: {ssh_problem}")
            continue
        if result.returncode != 0:
            said = result.stderr.strip().splitlines()[-1:] or ["no message"]
            hint = ""
            if "No module named" in result.stderr:
                hint = f" (distgnn is not installed for {python} there)"
            elif result.returncode == 127:
                hint = f" ({python} not found there; the servers use the training command's interpreter)"
            elif "can't cd" in result.stderr or "No such file" in result.stderr:
                hint = f" (the workspace {transport.workspace} must exist on every machine)"
            problems.append(f"{where}: preflight failed with status {result.returncode}: {said[0]}{hint}")
            continue
        try:
            report = json.loads(result.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            problems.append(f"{where}: preflight printed no report (stdout {result.stdout[-200:]!r})")
            continue
        if not report["torch"]:
            problems.append(f"{where}: torch is not installed for {report['python']} (trainers run through torchrun)")
        if report["busy_ports"]:
            problems.append(f"{where}: server ports already in use: {report['busy_ports']} (another job running?)")
        reports.append(report)
    if problems:
        raise LaunchError("preflight failed, nothing was started:\n  " + "\n  ".join(problems))
    return MachineFacts(reports[0]["free_port"], tuple(r["interface"] for r in reports))


def check_workspace(workspace: str, local: bool) -> None:
    if local and not os.path.isdir(workspace):
        raise LaunchError(f"the workspace {workspace} is not a directory")
