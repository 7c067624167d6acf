"""The launch plan: which process runs where, with which command line and environment.

A pure function of the ip_config, the options and what the preflight found
(rendezvous port, network interfaces) plus the job id, so it is unit-tested
without starting anything. Per machine:
``num_servers`` servers (``python -m distgnn.server``), then one torchrun agent
that starts ``num_trainers`` trainers running the user's command. With
``num_servers`` 0 (jobs whose trainers read their data themselves: event
streams, snapshot sequences) the torchrun agents are the whole job and the
trainers get no partition config unless one was given. The job token
is not part of the plan: it travels on each process's stdin (see ``remote.py``).
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import PurePath

from distgnn.launch import env as E
from distgnn.launch.ip_config import Machine

_PYTHON_NAME = re.compile(r"python[0-9.]*")
# Job variables only the launcher may set; the optional ones (E.CURVE, E.RPC_TIMEOUT) may come from --extra-env.
_SET_BY_LAUNCHER = frozenset(
    {
        E.ROLE,
        E.IP_CONFIG,
        E.PART_CONFIG,
        E.NUM_SERVERS,
        E.NUM_TRAINERS,
        E.NUM_SAMPLERS,
        E.MACHINE_ID,
        E.SERVER_ID,
        E.JOB_ID,
        E.TOKEN,
        E.RESTART_COUNT,
    }
)


class LaunchError(Exception):
    """The job cannot start: bad arguments, configuration, or an unreachable machine."""


@dataclass(frozen=True)
class LaunchOptions:
    """What the user asked for (``distgnn-launch`` flags), with paths already resolved."""

    ip_config: str
    part_config: str | None  # None only with num_servers 0
    command: tuple[str, ...]
    num_trainers: int
    num_servers: int = 1
    num_samplers: int = 0
    workspace: str = "."
    extra_env: tuple[tuple[str, str], ...] = ()
    server_command: tuple[str, ...] | None = None
    local: bool = False


@dataclass(frozen=True)
class ProcessSpec:
    """One process of the job: started on ``machine_id`` as ``argv`` with ``env`` added."""

    machine_id: int
    host: str
    role: str  # "server" or "trainer" (a torchrun agent running the machine's trainers, or one trainer)
    index: int  # server id; the machine's node rank for a trainer agent; the global rank of one trainer
    argv: tuple[str, ...]
    env: dict[str, str] = field(compare=False)
    cleanup_dirs: tuple[str, ...] = ()
    agent: bool = True  # a trainer: a torchrun agent (distgnn-launch) or one trainer (the local runner's)

    @property
    def is_agent(self) -> bool:
        """A torchrun agent running the machine's trainers."""
        return self.role == "trainer" and self.agent

    @property
    def label(self) -> str:
        role = "torchrun" if self.is_agent else self.role
        return f"{self.machine_id}/{role}/{self.index}"

    def describe(self) -> str:
        what = f"server {self.index}" if self.role == "server" else "torchrun agent (trainers)"
        if self.role == "trainer" and not self.agent:
            what = f"trainer {self.index}"
        return f"{what} on machine {self.machine_id} ({self.host})"


def is_python(program: str) -> bool:
    """Whether a command's first word names a Python interpreter (``python``, ``/venv/bin/python3.11``)."""
    return bool(_PYTHON_NAME.fullmatch(PurePath(program).name))


def python_of(command: tuple[str, ...]) -> str:
    """The interpreter that runs servers and torchrun: the user command's own python, else ``python3``."""
    return command[0] if command and is_python(command[0]) else "python3"


def check_command(command: tuple[str, ...]) -> None:
    """torchrun takes ``SCRIPT ARGS`` or ``-m MODULE ARGS`` after the interpreter, nothing else."""
    if not command:
        raise LaunchError("no training command: put it after '--', e.g. -- python train.py --epochs 3")
    if is_python(command[0]):
        if len(command) < 2:
            raise LaunchError(f"the training command {shlex.join(command)!r} names no script")
        if command[1].startswith("-") and command[1] != "-m":
            raise LaunchError(
                f"the training command passes interpreter option {command[1]!r}; torchrun accepts only "
                "'python SCRIPT ARGS' or 'python -m MODULE ARGS' (set PYTHON* variables with --extra-env instead)"
            )


def parse_extra_env(items: list[str]) -> tuple[tuple[str, str], ...]:
    """``K=V`` strings to pairs; the job's own variables cannot be overridden."""
    pairs = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise LaunchError(f"--extra-env expects NAME=VALUE with a shell variable name, got {item!r}")
        if name in _SET_BY_LAUNCHER:
            raise LaunchError(f"--extra-env cannot set {name}: the launcher sets it (use the matching flag)")
        pairs.append((name, value))
    return tuple(pairs)


def torchrun_log_dir(job_id: str, machine_id: int) -> str:
    """Where torchrun tees its workers' output on a machine (removed when the agent ends)."""
    return f"/tmp/distgnn-{job_id}-m{machine_id}-torchrun"


def job_env(
    opts: LaunchOptions, job_id: str, machine_id: int, role: str, server_id: int = 0, restart_count: int = 0
) -> dict[str, str]:
    """The environment ``distgnn.initialize`` reads (``JobConfig.from_env``), minus the token."""
    env = dict(opts.extra_env)
    env.setdefault("PYTHONUNBUFFERED", "1")  # output streams back line by line, not at exit
    env.update(
        {
            E.ROLE: role,
            E.IP_CONFIG: opts.ip_config,
            E.NUM_SERVERS: str(opts.num_servers),
            E.NUM_TRAINERS: str(opts.num_trainers),
            E.NUM_SAMPLERS: str(opts.num_samplers),
            E.MACHINE_ID: str(machine_id),
            E.SERVER_ID: str(server_id),
            E.JOB_ID: job_id,
            E.RESTART_COUNT: str(restart_count),
        }
    )
    if opts.part_config is not None:
        env[E.PART_CONFIG] = opts.part_config
    return env


def server_specs(
    machines: list[Machine], opts: LaunchOptions, job_id: str, restart_count: int = 0
) -> list[ProcessSpec]:
    """``opts.num_servers`` servers on every machine, in machine order."""
    server_argv = opts.server_command or (python_of(opts.command), "-m", "distgnn.server")
    specs = []
    for machine_id, machine in enumerate(machines):
        for server_id in range(opts.num_servers):
            env = job_env(opts, job_id, machine_id, "server", server_id, restart_count)
            specs.append(ProcessSpec(machine_id, machine.ip, "server", server_id, tuple(server_argv), env))
    return specs


def build_plan(
    machines: list[Machine],
    opts: LaunchOptions,
    job_id: str,
    master_port: int,
    interfaces: tuple[str | None, ...] | None = None,
    restart_count: int = 0,
) -> list[ProcessSpec]:
    """Every process of the job, all servers first (in machine order), then one trainer agent per machine
    (with ``opts.num_servers`` 0 only the agents).

    ``restart_count`` (``DISTGNN_RESTART_COUNT`` in every process) is k when the job is started for
    the k-th time after a failure (``--max-restarts``); 0 at first.

    ``interfaces[i]`` is machine i's interface holding its ip_config address: gloo binds there
    (GLOO_SOCKET_IFNAME) unless --extra-env says otherwise, instead of wherever the
    hostname resolves, which is often an address the other machines cannot reach.
    """
    python = python_of(opts.command)
    specs = server_specs(machines, opts, job_id, restart_count)
    master_addr = machines[0].ip
    for machine_id, machine in enumerate(machines):
        log_dir = torchrun_log_dir(job_id, machine_id)
        torchrun = [
            python,
            "-m",
            "torch.distributed.run",
            f"--nnodes={len(machines)}",
            f"--node-rank={machine_id}",
            f"--nproc-per-node={opts.num_trainers}",
            f"--master-addr={master_addr}",
            f"--master-port={master_port}",
            "--max-restarts=0",
            # tee: every trainer's lines come back prefixed with its local rank.
            "--tee=3",
            f"--log-dir={log_dir}",
        ]
        if is_python(opts.command[0]):
            torchrun.extend(opts.command[1:])  # torchrun runs the script (or -m module) with its own python
        else:
            torchrun.extend(["--no-python", *opts.command])
        env = job_env(opts, job_id, machine_id, "trainer", restart_count=restart_count)
        if interfaces and interfaces[machine_id]:
            env.setdefault("GLOO_SOCKET_IFNAME", interfaces[machine_id])
        specs.append(ProcessSpec(machine_id, machine.ip, "trainer", machine_id, tuple(torchrun), env, (log_dir,)))
    return specs


def local_plan(
    machines: list[Machine],
    opts: LaunchOptions,
    job_id: str,
    master_port: int,
    restart_count: int = 0,
    trainer_env: dict[str, str] | None = None,
) -> list[ProcessSpec]:
    """A job whose machines all are this host, its trainers started one by one (no torchrun agent): the
    servers of :func:`build_plan`, then trainer ``r`` of machine ``r // opts.num_trainers`` running
    ``opts.command`` with torchrun's environment, ``LOCAL_RANK`` numbering every trainer of the host (each
    gets its own GPU) and ``trainer_env`` added."""
    specs = server_specs(machines, opts, job_id, restart_count)
    world = len(machines) * opts.num_trainers
    for rank in range(world):
        machine_id = rank // opts.num_trainers
        env = job_env(opts, job_id, machine_id, "trainer", restart_count=restart_count)
        env.update(trainer_env or {})
        env.update(
            RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(world),
            GROUP_RANK=str(machine_id),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(master_port),
        )
        host = machines[machine_id].ip
        specs.append(ProcessSpec(machine_id, host, "trainer", rank, opts.command, env, agent=False))
    return specs


def wrapper_argv(spec: ProcessSpec, python: str, grace_s: float) -> list[str]:
    """The command that runs ``spec`` under the process-tree owner of ``remote.py``."""
    argv = [python, "-m", "distgnn.launch.remote", "run", "--job-id", spec.env[E.JOB_ID], f"--grace={grace_s:g}"]
    for path in spec.cleanup_dirs:
        argv += ["--remove-dir", path]
    return [*argv, "--", *spec.argv]


def remote_shell_command(workspace: str, env: dict[str, str], argv: list[str]) -> str:
    """One POSIX shell line for ssh: enter the workspace, set the environment, exec ``argv``."""
    assignments = [f"{name}={shlex.quote(value)}" for name, value in env.items()]
    return f"cd {shlex.quote(workspace)} && exec env {' '.join(assignments)} {shlex.join(argv)}"


def resolve_path(path: str, workspace: str) -> str:
    """Relative paths are relative to the workspace; every machine gets the same absolute path."""
    return os.path.normpath(os.path.join(workspace, os.path.expanduser(path)))
