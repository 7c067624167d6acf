"""Running a training script as a job: the flags every example shares, the local runner, the trainer side.

* :func:`add_job_args` adds the job flags (cluster shape, loader, mode, seed, device, threads).
* :func:`run_local` runs the calling script as a whole job on this host under ``distgnn-launch``'s supervisor
  (:class:`distgnn.launch.supervisor.Job`): the job's servers over the partition (made in the work directory
  when needed) and its trainers (the script again, with torchrun's environment); it waits, and stops
  everything on a failure, Ctrl-C or SIGTERM, and with ``--max-restarts`` starts a failed job again.
  Output streams to the console and into ``<workdir>/runs/<run>/``; when a process dies, one line says which
  one caused the failure and how, and a second sums up the rest (``distgnn.launch.failure``).
* :func:`start_trainer` is the trainer side: torch.distributed, ``distgnn.initialize``, the DistGraph and the
  per-machine gloo group, or with ``--single`` the whole graph in this process; it shuts all of it down.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import importlib
import logging
import os
import secrets
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from distgnn.client.context import initialize, shutdown
from distgnn.client.graph import DistGraph
from distgnn.client.split import node_split
from distgnn.client.tensor import DistTensor
from distgnn.data.datasets import DatasetSpec, load_dataset
from distgnn.errors import ConfigError
from distgnn.launch.cpus import cpu_share, cpus_each
from distgnn.launch.ip_config import read_ip_config
from distgnn.launch.plan import LaunchOptions, local_plan
from distgnn.launch.supervisor import Job
from distgnn.launch.transport import LocalTransport
from distgnn.partition.format import read_meta
from distgnn.sampling.source import InProcessGraph
from distgnn.train.allocator import keep_freed_memory
from distgnn.train.cluster import free_port_block
from distgnn.train.result import exit_code, print_result

log = logging.getLogger(__name__)

# Set by run_local for its trainers when its own stderr is a terminal: theirs is a pipe, the console is not.
STDERR_TTY_ENV = "DISTGNN_STDERR_TTY"


def add_job_args(parser: argparse.ArgumentParser, epochs: int = 10) -> argparse._ArgumentGroup:
    """The job flags every example takes; ``--local`` and ``--single`` exclude each other."""
    group = parser.add_argument_group("job")
    group.add_argument("--num-parts", type=int, default=2, help="machines (= partitions)")
    group.add_argument("--part-method", default="metis", choices=("metis", "random"))
    group.add_argument("--trainers-per-machine", type=int, default=1)
    group.add_argument("--servers-per-machine", type=int, default=1)
    group.add_argument("--num-workers", type=int, default=0, help="sampler processes per trainer (0: a thread)")
    group.add_argument(
        "--prefetch",
        type=int,
        default=None,
        help="batches made ahead per worker (default 2); with 0 workers, > 0 samples in a background thread (default 0:\n"
        "inline; GraphSAGE with --sample-device cuda: 1 where the host has several trainers)",
    )
    group.add_argument("--epochs", type=int, default=epochs)
    group.add_argument("--max-batches", type=int, default=0, help="cap on batches per epoch (0: all)")
    group.add_argument("--seed", type=int, default=0)
    group.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    group.add_argument(
        "--sync-timing",
        action="store_true",
        help="with --device cuda: wait for the GPU after each stage so the sample/fetch/compute split adds up\n"
        "(costs the overlap of the next batch's host work with this batch's GPU work); without it compute is\n"
        "GPU time from CUDA events, and a stage that waits for the GPU absorbs the previous step's compute",
    )
    group.add_argument("--workdir", default=".work/train", help="partitions (and logs) go here with --local")
    group.add_argument("--num-threads", type=int, default=0, help="torch threads per trainer (0: cores / trainers)")
    group.add_argument(
        "--bind-cpus",
        default="auto",
        choices=("auto", "yes", "no"),
        help="yes: each trainer of a host runs on its own share of the CPUs the job may use (by LOCAL_RANK, a\n"
        "contiguous slice each), its threads included; auto (default): yes with --device cuda (a GPU trainer's\n"
        "host threads launch its kernels), no on CPUs (the graph servers share the host's CPUs)",
    )
    group.add_argument(
        "--matmul-precision",
        default="highest",
        choices=("highest", "high", "medium"),
        help="float32 matrix products (torch.set_float32_matmul_precision): highest keeps float32; high: TF32 on\n"
        "a GPU (~1e-3 error); medium: also bfloat16 inputs on a CPU's AMX units for the GNN layers' products\n"
        "(float32 accumulation, ~3e-3 error; distgnn.nn.matmul)",
    )
    group.add_argument(
        "--no-malloc-tuning",
        action="store_true",
        help="leave glibc malloc as it is (default: trainers keep freed memory for reuse, see distgnn.train.allocator)",
    )
    group.add_argument(
        "--no-gc-tuning",
        action="store_true",
        help="leave Python's garbage collector as it is during the steps (default: it collects at fixed steps,\n"
        "the same on every trainer, see distgnn.train.allocator)",
    )
    group.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        metavar="R",
        help="with --local: when a process fails, stop the job and start it again, up to R times (each process\n"
        "gets DISTGNN_RESTART_COUNT; with --checkpoint-dir and --resume auto the trainers continue)",
    )
    group.add_argument("--quiet", action="store_true", help="no progress bar")
    group.add_argument("--no-eval", action="store_true", help="skip the final evaluation")
    mode = group.add_mutually_exclusive_group()
    mode.add_argument("--local", action="store_true", help="run the whole job on this host")
    mode.add_argument("--single", action="store_true", help="single-process reference run")
    return group


def log_to_stderr() -> None:
    """Show what the job and dataset modules report (partitioning, a failed process) on stderr, for CLIs."""
    logging.basicConfig(format="%(message)s")
    for name in (__name__, "distgnn.partition.prepare"):
        logging.getLogger(name).setLevel(logging.INFO)


def torch_threads(args: argparse.Namespace, trainers_on_host: int) -> int:
    """``--num-threads``, or the CPUs this process may run on (its affinity: a container's or ``taskset``'s
    share, not every CPU of the host) shared out among the host's trainers."""
    return args.num_threads or cpus_each(trainers_on_host)


def binds_cpus(args: argparse.Namespace) -> bool:
    """Whether ``--bind-cpus`` binds this trainer to its :func:`~distgnn.launch.cpus.cpu_share`."""
    choice = getattr(args, "bind_cpus", "no")
    return choice == "yes" or (choice == "auto" and getattr(args, "device", "cpu") == "cuda")


def configure_torch(args: argparse.Namespace, trainers_on_host: int, local_rank: int = 0) -> None:
    """This trainer's torch settings from the job flags: with ``--bind-cpus`` this process (and every thread it
    starts after) on its :func:`~distgnn.launch.cpus.cpu_share`, its threads (:func:`torch_threads`) and ``--matmul-precision``."""
    if binds_cpus(args):
        try:
            share = cpu_share(local_rank, trainers_on_host)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        os.sched_setaffinity(0, share)
        torch.set_num_threads(args.num_threads or len(share))
    else:
        torch.set_num_threads(torch_threads(args, trainers_on_host))
    torch.set_float32_matmul_precision(args.matmul_precision)


# -- the local runner --------------------------------------------------------------------------------


def run_local(
    script: str | os.PathLike, argv: list[str], args: argparse.Namespace, part_config: str | os.PathLike | None
) -> int:
    """Run ``script`` (the caller, again, without ``--local``) as every trainer of a job on this host, on the
    partition ``part_config`` (e.g. of :func:`distgnn.partition.prepare.ensure_partition`) with
    ``--servers-per-machine`` servers per simulated machine; with ``part_config`` None, trainers alone (jobs whose
    trainers read their data themselves: event streams, snapshot sequences), given a job id and their machine
    (``DISTGNN_JOB_ID``, ``DISTGNN_MACHINE_ID``) for what they share in shared memory.

    The job is ``distgnn-launch``'s :class:`~distgnn.launch.supervisor.Job` on this host: every process under
    the launcher's wrapper, a failure named in one line (and the job stopped), the job's processes and shared
    memory removed however it ends, and with ``--max-restarts R`` a failed job started again up to R times
    (``DISTGNN_RESTART_COUNT``). Output streams to the console; each process's also into
    ``<workdir>/runs/<run>/`` (``trainer-<rank>.log``, ``server-m<machine>-s<server>.log``).

    ``args`` carries the job flags of :func:`add_job_args`. Returns 0 when every trainer succeeded, else the exit
    code of the process that failed first (1 for a signal). After Ctrl-C or SIGTERM it stops the job and ends
    this process at once with 130 or 143. Servers write only to their logs.
    """
    if args.max_restarts < 0:
        raise ConfigError(f"--max-restarts must be >= 0, got {args.max_restarts}")
    run_dir = Path(args.workdir) / "runs" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    run_dir.mkdir(parents=True, exist_ok=True)
    job_id, token = f"j{secrets.token_hex(4)}", secrets.token_hex(16)
    for restart in range(args.max_restarts + 1):
        attempt = _local_job(Path(script), argv, args, part_config, run_dir, job_id, token, restart)
        code = attempt.run()
        if attempt.signal_received is not None:
            _exit_now(code)
        if code == 0 or attempt.cause is None:
            return code
        if restart < args.max_restarts:
            log.error("restarting the job (%d of %d); cause: %s", restart + 1, args.max_restarts, attempt.cause.who())
    if args.max_restarts:
        log.error("giving up after %d restarts", args.max_restarts)
    return attempt.cause.returncode if attempt.cause.returncode > 0 else 1


def _local_job(
    script: Path,
    argv: list[str],
    args: argparse.Namespace,
    part_config: str | os.PathLike | None,
    run_dir: Path,
    job_id: str,
    token: str,
    restart: int,
) -> Job:
    """One attempt of :func:`run_local`'s job, on fresh ports."""
    threads = torch_threads(args, args.num_parts * args.trainers_per_machine)
    trainer_argv = [a for a in argv if a != "--local"] + ["--num-threads", str(threads)]
    num_servers = 0 if part_config is None else args.servers_per_machine
    width, taken, bases = max(num_servers, 1), set(), []  # a trainers-alone job's machines get a port each
    for _ in range(args.num_parts):
        bases.append(free_port_block(width, taken))
        taken.update(range(bases[-1], bases[-1] + width))
    ip_config = run_dir / f"ip_config-{restart}.txt"
    ip_config.write_text("".join(f"127.0.0.1 {base}\n" for base in bases))
    opts = LaunchOptions(
        ip_config=str(ip_config.resolve()),
        part_config=None if part_config is None else str(Path(part_config).resolve()),
        command=(sys.executable, str(script.resolve()), *trainer_argv),
        num_trainers=args.trainers_per_machine,
        num_servers=num_servers,
        server_command=(sys.executable, "-m", "distgnn.server"),
        local=True,
    )
    # Every simulated machine shares this host: LOCAL_RANK numbers the trainers of the host, so each one gets its
    # own GPU.
    trainer_env = {"OMP_NUM_THREADS": str(threads), **({STDERR_TTY_ENV: "1"} if sys.stderr.isatty() else {})}
    plan = local_plan(read_ip_config(ip_config), opts, job_id, _free_port(taken), restart, trainer_env)
    return Job(
        plan,
        LocalTransport(os.getcwd()),
        sys.executable,
        token,
        args.trainers_per_machine,
        out=sys.stdout,
        err=sys.stderr,
        log_dir=run_dir if restart == 0 else run_dir / f"attempt-{restart}",
        name="",
        labelled=False,
        log_name=_log_name,
        server_exit_grace_s=0.0,
        quiet_roles=("server",),
    )


def _log_name(label: str) -> str:
    """``trainer-<rank>.log``, ``server-m<machine>-s<server>.log``."""
    machine, role, index = label.split("/")
    return f"trainer-{index}.log" if role == "trainer" else f"{role}-m{machine}-s{index}.log"


def _free_port(taken: set[int]) -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in taken:
            return port


def _exit_now(code: int) -> NoReturn:
    """Ends the process with ``code`` once the job is stopped, skipping the interpreter's teardown: unloading
    torch takes seconds on a busy host, seconds that whoever sent the signal would wait for."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


# -- the trainer side --------------------------------------------------------------------------------


@dataclass
class Trainer:
    """What a training loop needs from its job, the same for a DistGraph and the single-process reference.

    Attributes:
        g: the DistGraph, or the InProcessGraph with ``--single``.
        device: this trainer's device (``cuda:LOCAL_RANK`` with ``--device cuda``).
        rank, world_size: this trainer's place among the job's trainers (0 and 1 in a single process).
        machine_group: the gloo group of this machine's trainers (None in a single process).
        show_progress: rank 0, not ``--quiet``, and the console is a terminal.
        machine, trainers_per_machine: this trainer's machine and how many trainers it has (0 and 1 in a
            single process).
    """

    g: Any
    device: torch.device
    rank: int
    world_size: int
    machine_group: Any
    show_progress: bool
    machine: int = 0
    trainers_per_machine: int = 1

    @property
    def distributed(self) -> bool:
        return isinstance(self.g, DistGraph)

    def seeds(self, mask_name: str, ntype: str | None = None) -> torch.Tensor:
        """``(n,)`` int64: this trainer's share of the nodes where ``mask_name`` is set (per-type ids of
        ``ntype`` on a typed graph)."""
        data = self.g.ndata if ntype is None else self.g.nodes[ntype].data
        if not self.distributed:
            return torch.nonzero(torch.as_tensor(data[mask_name])).flatten()
        if ntype is None:
            return node_split(data[mask_name], self.g.get_partition_book(), force_even=True)
        return node_split(data[mask_name], self.g.get_partition_book(), ntype=ntype)

    def result_fields(self, args: argparse.Namespace, batches_per_epoch: int) -> dict:
        """The RESULT keys every example prints first: what ran, where and how long."""
        return {
            "dataset": args.dataset,
            "device": str(self.device),
            "backend": dist.get_backend() if dist.is_initialized() else None,
            "num_trainers": self.world_size,
            "num_parts": self.g.get_partition_book().num_partitions,
            "epochs": args.epochs,
            "batches_per_epoch": batches_per_epoch,
        }

    def inference_nodes(self) -> torch.Tensor:
        """``(n,)`` int64: the nodes this trainer infers: its machine's, shared among the machine's trainers."""
        if not self.distributed:
            return torch.arange(self.g.num_nodes())
        start, end = self.g.get_partition_book().node_range(self.machine)
        return torch.tensor_split(torch.arange(start, end), self.trainers_per_machine)[
            self.rank % self.trainers_per_machine
        ]

    def new_buffer(self, layer: int, dim: int) -> Any:
        """A float32 ``(num_nodes, dim)`` node tensor for layer ``layer``'s output of layer-wise inference:
        a DistTensor every trainer writes its rows into, or a plain tensor in a single process."""
        if not self.distributed:
            return torch.zeros(self.g.num_nodes(), dim)
        return DistTensor((self.g.num_nodes(), dim), torch.float32, name=f"infer-h{layer}")


@contextlib.contextmanager
def start_trainer(
    args: argparse.Namespace, single_graph: Callable[[argparse.Namespace], Any] | None = None
) -> Iterator[Trainer]:
    """This process's trainer of a job started by ``distgnn-launch`` or :func:`run_local` (torchrun's and
    distgnn's environment set), or with ``args.single`` the whole dataset (or ``single_graph(args)``) in this
    process. On leaving, the trainers meet at a barrier (after success), then distgnn and torch.distributed
    shut down."""
    if not args.no_malloc_tuning:
        # Reuse freed memory across batches instead of page-faulting fresh mmaps (see distgnn.train.allocator).
        keep_freed_memory()
    quiet = args.quiet or not (sys.stderr.isatty() or os.environ.get(STDERR_TTY_ENV) == "1")
    if args.single:
        configure_torch(args, 1)
        g = InProcessGraph(single_graph(args) if single_graph else load_dataset(DatasetSpec.from_args(args)))
        yield Trainer(g, torch.device(args.device), 0, 1, None, not quiet)
        return
    device = join_process_group(args)
    ctx = initialize()
    try:
        if ctx.config.part_config is None:
            raise ConfigError("no partition config: start trainers through distgnn-launch or with --local")
        g = DistGraph(read_meta(ctx.config.part_config).graph_name)
        machine = ctx.config.machine_id
        rank = dist.get_rank()
        yield Trainer(
            g,
            device,
            rank,
            dist.get_world_size(),
            machine_group(machine),
            rank == 0 and not quiet,
            machine,
            ctx.config.num_trainers,
        )
        dist.barrier()
    finally:
        shutdown()
        dist.destroy_process_group()


def main(
    script: str,
    argv: list[str] | None,
    parse_args: Callable[[list[str]], argparse.Namespace],
    partition: Callable[[argparse.Namespace], Path | None],
    run_trainer: Callable[[Any, argparse.Namespace], dict],
    single_graph: Callable[[argparse.Namespace], Any] | None = None,
    *,
    kind: str,
    start: Callable[[argparse.Namespace], contextlib.AbstractContextManager] | None = None,
) -> int:
    """An example's ``main``: with ``--local`` the whole job on this host over ``partition(args)`` (made on the
    first run, reused after; None for a job of trainers alone, which ``partition`` checks the input of), else
    this trainer (or ``--single``, over ``single_graph(args)`` if given) runs ``run_trainer``; rank 0 prints
    ``RESULT {json}`` of the job ``kind`` (:mod:`distgnn.train.result`). ``start(args)`` enters the trainer
    (default :func:`start_trainer`: a DistGraph over the job's servers); what it yields has a ``rank``. Bad
    input or a failed job: one ``error:`` line and exit code 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    log_to_stderr()
    enter = start or (lambda a: start_trainer(a, single_graph))

    def body() -> int:
        if args.local:
            return run_local(script, argv, args, partition(args))
        with enter(args) as trainer:
            result = run_trainer(trainer, args)
        if trainer.rank == 0:
            print_result(result, kind)
        return 0

    return exit_code(body)


def join_process_group(args: argparse.Namespace, procs_per_gpu: int = 1, backend: str | None = None) -> torch.device:
    """Join the job's torch.distributed group as the trainer torchrun started (under :func:`run_local` or
    ``distgnn-launch``): torch threads for the trainers sharing this host, with ``--device cuda`` this trainer's
    GPU (``LOCAL_RANK // procs_per_gpu``), and the group (NCCL for CUDA tensors and gloo for the small CPU
    collectives, unless ``backend`` names one). Returns the trainer's device."""
    # A crash in native code (an abort, a segfault) prints every Python thread's stack, not just a signal.
    faulthandler.enable()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    # torchrun (under distgnn-launch) says how many trainers share this host.
    configure_torch(args, int(os.environ.get("LOCAL_WORLD_SIZE", args.trainers_per_machine)), local_rank)
    device = torch.device("cpu")
    if args.device == "cuda":
        gpu = local_rank // procs_per_gpu
        if gpu >= torch.cuda.device_count():
            raise ConfigError(
                f"trainer with LOCAL_RANK {local_rank} ({procs_per_gpu} per GPU) needs GPU {gpu}, this host has "
                f"{torch.cuda.device_count()}; start at most {procs_per_gpu} trainer(s) per GPU"
            )
        device = torch.device("cuda", gpu)
        torch.cuda.set_device(device)
    # torch's compile stack, imported on first use by torch.optim's optimizers and DDP, keeps a reference to every
    # process group that exists when it is first imported. A group made before that import outlives
    # destroy_process_group: its gloo threads and sockets run on into the interpreter's exit, which tears them down
    # while the peers close theirs (a rare abort at the end of a job). Imported before the group, it holds none.
    importlib.import_module("torch._dynamo")
    dist.init_process_group(backend or ("cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"))
    return device


def machine_group(machine: int) -> Any:
    """A gloo group of the trainers on ``machine`` (collective: every trainer creates every machine's group)."""
    ids = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(ids, torch.tensor([machine], dtype=torch.int64))
    machines = [int(t) for t in ids]
    mine = None
    for m in sorted(set(machines)):
        group = dist.new_group([r for r, owner in enumerate(machines) if owner == m], backend="gloo")
        if m == machine:
            mine = group
    return mine
