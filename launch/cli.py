"""``distgnn-launch``: start a distgnn job on every machine of an ip_config, over ssh or locally.

    distgnn-launch --ip-config ip_config.txt --part-config data/g.json \\
                   --num-trainers 2 --num-servers 1 -- python train.py --epochs 3

With ``--num-servers 0`` no graph servers start and ``--part-config`` is
optional: one torchrun agent per machine runs the trainers, for jobs whose
trainers read their data themselves (the temporal and snapshot examples).

Everything is checked before anything starts; then each machine runs its
servers and a torchrun agent with its trainers; output streams back prefixed
with ``[machine/role/rank]`` and is kept in full in the run directory; any
failure or Ctrl-C stops the whole job on every machine, and a failure is
reported as one line naming the process that died first. With
``--max-restarts R`` a failed job is started again, up to R times. See
docs/cluster.md.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shlex
import sys
import time
from pathlib import Path

from distgnn.launch import slurm
from distgnn.launch.plan import (
    LaunchError,
    LaunchOptions,
    build_plan,
    check_command,
    parse_extra_env,
    python_of,
    resolve_path,
)
from distgnn.launch.preflight import check_machines, check_workspace, read_machines
from distgnn.launch.supervisor import Job
from distgnn.launch.transport import LocalTransport, SshTransport


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="distgnn-launch",
        usage="distgnn-launch --ip-config FILE [--part-config JSON | --num-servers 0] --num-trainers T [options] "
        "-- COMMAND...",
        description="Start a distgnn job on every machine of an ip_config, over ssh or locally (see docs/cluster.md).",
    )
    parser.add_argument(
        "--ip-config",
        help="one machine per line: IP [PORT]; line i holds partition i (with --slurm: default one line per node)",
    )
    parser.add_argument(
        "--part-config",
        help="the partition JSON written by distgnn-partition (required unless --num-servers 0; "
        "if given, its num_parts must equal the ip_config's machines)",
    )
    parser.add_argument("--num-trainers", type=int, required=True, help="trainer processes per machine")
    parser.add_argument(
        "--num-servers",
        type=int,
        default=1,
        help="server processes per machine (default 1); 0: no graph servers, only the trainers "
        "(jobs whose trainers read their data themselves)",
    )
    parser.add_argument("--num-samplers", type=int, default=0, help="sampler workers per trainer (default 0)")
    parser.add_argument(
        "--workspace",
        default=os.getcwd(),
        help="directory every process starts in, on every machine; relative paths are resolved against it "
        "(default: the current directory)",
    )
    parser.add_argument("--ssh-port", type=int, default=22, help="sshd port on every machine (default 22)")
    parser.add_argument("--ssh-user", help="remote user (default: ssh's default)")
    parser.add_argument("--ssh-key", help="private key file for ssh (-i)")
    parser.add_argument(
        "--ssh-option",
        action="append",
        default=[],
        metavar="OPT",
        help="extra ssh -o option, e.g. UserKnownHostsFile=/path (repeatable)",
    )
    parser.add_argument(
        "--extra-env",
        action="extend",
        nargs="+",
        default=[],
        metavar="K=V",
        help="environment variables for every process (repeatable)",
    )
    parser.add_argument(
        "--server-command",
        help="command that runs one server (default: PYTHON -m distgnn.server, PYTHON from the training command)",
    )
    parser.add_argument(
        "--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL when stopping (default 5)"
    )
    parser.add_argument("--local", action="store_true", help="run every machine on this host, without ssh")
    parser.add_argument(
        "--slurm",
        action="store_true",
        help="inside salloc/sbatch: machine i is node i of $SLURM_JOB_NODELIST, every process an srun step (no ssh)",
    )
    parser.add_argument(
        "--port", type=int, default=30050, help="with --slurm and no --ip-config: first server port (default 30050)"
    )
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        metavar="R",
        help="when a process fails, stop the job and start it again, up to R times; every process gets "
        "DISTGNN_RESTART_COUNT=k (0 at first), so a training script can resume from its last checkpoint (default 0)",
    )
    parser.add_argument(
        "--run-dir",
        help="directory that keeps every process's full output, one file per process and attempt "
        "(default: ./distgnn-runs/JOB_ID)",
    )
    return parser


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Split at the first ``--``: launcher flags before it, the training command after it."""
    if "--" in argv:
        cut = argv.index("--")
        flags, command = argv[:cut], argv[cut + 1 :]
    else:
        flags, command = argv, []
    return build_parser().parse_args(flags), command


def options_from_args(args: argparse.Namespace, command: list[str]) -> LaunchOptions:
    check_command(tuple(command))
    if args.local and args.slurm:
        raise LaunchError("--local and --slurm exclude each other: pick where the machines are")
    if not args.ip_config:
        raise LaunchError("--ip-config is required (except with --slurm, which can write one from the node list)")
    if args.num_trainers < 1 or args.num_servers < 0 or args.num_samplers < 0 or args.max_restarts < 0:
        raise LaunchError(
            f"need --num-trainers >= 1, --num-servers >= 0, --num-samplers >= 0, --max-restarts >= 0; got "
            f"{args.num_trainers}, {args.num_servers}, {args.num_samplers}, {args.max_restarts}"
        )
    if args.num_servers > 0 and not args.part_config:
        raise LaunchError(
            f"--part-config is required with --num-servers {args.num_servers} (the servers serve a partition); "
            "for trainers that read their data themselves pass --num-servers 0"
        )
    if args.num_servers == 0 and (args.num_samplers or args.server_command):
        raise LaunchError(
            "--num-samplers and --server-command need graph servers; drop them or pass --num-servers >= 1"
        )
    workspace = os.path.abspath(os.path.expanduser(args.workspace))
    return LaunchOptions(
        ip_config=resolve_path(args.ip_config, workspace),
        part_config=resolve_path(args.part_config, workspace) if args.part_config else None,
        command=tuple(command),
        num_trainers=args.num_trainers,
        num_servers=args.num_servers,
        num_samplers=args.num_samplers,
        workspace=workspace,
        extra_env=parse_extra_env(args.extra_env),
        server_command=tuple(shlex.split(args.server_command)) if args.server_command else None,
        local=args.local,
    )


def main(argv: list[str] | None = None) -> int:
    args, command = parse_args(sys.argv[1:] if argv is None else argv)
    job_id = f"j{secrets.token_hex(4)}"
    run_dir = Path(args.run_dir or Path("distgnn-runs") / job_id).absolute()
    try:
        nodes = None
        if args.slurm:
            nodes = slurm.job_nodes()
            if not args.ip_config:
                args.ip_config = str(run_dir / "ip_config.txt")
                slurm.write_ip_config(nodes, args.port, args.num_servers, Path(args.ip_config))
        opts = options_from_args(args, command)
        check_workspace(opts.workspace, opts.local)
        machines = read_machines(opts)
        if opts.local:
            transport = LocalTransport(opts.workspace)
        elif nodes is not None:
            transport = slurm.SlurmTransport(opts.workspace, machines, nodes)
        else:
            transport = SshTransport(opts.workspace, args.ssh_port, args.ssh_user, args.ssh_key, tuple(args.ssh_option))
        python = python_of(opts.command)
        facts = check_machines(machines, transport, python, opts.num_servers)
    except LaunchError as exc:
        print(f"distgnn-launch: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("distgnn-launch: interrupted during the preflight; nothing was started", file=sys.stderr)
        return 130
    token = secrets.token_hex(16)
    restart = 0
    while True:
        plan = build_plan(machines, opts, job_id, facts.master_port, facts.interfaces, restart_count=restart)
        per_machine = (
            f"({opts.num_servers} servers + {opts.num_trainers} trainers)"
            if opts.num_servers
            else f"{opts.num_trainers} trainers (no graph servers)"
        )
        print(
            f"distgnn-launch: job {job_id}: {len(machines)} machines x {per_machine} "
            f"via {transport.name}, rendezvous {machines[0].ip}:{facts.master_port}"
            + (f", restart {restart} of {args.max_restarts}" if restart else ""),
            file=sys.stderr,
            flush=True,
        )
        job = Job(plan, transport, python, token, opts.num_trainers, args.grace, log_dir=run_dir / f"attempt-{restart}")
        code = job.run()
        if code == 0 or job.cause is None or restart >= args.max_restarts:
            if job.cause is not None and args.max_restarts:
                print(f"distgnn-launch: giving up after {restart} restarts", file=sys.stderr)
            return code
        restart += 1
        failed_at = time.monotonic()
        try:
            # The stopped job's ports must be free again and the rendezvous needs a fresh port.
            facts = check_machines(machines, transport, python, opts.num_servers)
        except LaunchError as exc:
            print(f"distgnn-launch: error: cannot restart: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("distgnn-launch: interrupted before the restart; nothing is running", file=sys.stderr)
            return 130
        print(
            f"distgnn-launch: restarting job {job_id} ({restart} of {args.max_restarts}) "
            f"{time.monotonic() - failed_at:.1f} s after stopping it; cause: {job.cause.who()}",
            file=sys.stderr,
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
