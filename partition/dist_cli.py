"""``distgnn-partition --workers W``: the distributed job's command line (one rank, or ``--local``'s W ranks).

``--local`` checks the input and the memory, imports torch.distributed, then forks ranks 0..W-1 with
torchrun's environment on this host: when one fails, the others are stopped; Ctrl-C and SIGTERM stop them
all.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from typing import NoReturn

import numpy as np

from distgnn.errors import ConfigError, DistGNNError, InputError
from distgnn.launch.cpus import local_world_size
from distgnn.launch.forked import INTERRUPTED_EXIT, ForkedRanks
from distgnn.launch.transport import free_port
from distgnn.partition.distributed import DIST_METHODS, DistOptions, check_chunking, partition_distributed
from distgnn.partition.format import available_bytes, check_output_dir
from distgnn.partition.memory import BASE_BYTES, estimate_ranks, resident_bytes

# How long a rank gets to remove its staging directory after it is told to stop.
STOP_GRACE_S = 10.0
GIB = float(1 << 30)

log = logging.getLogger(__name__)


def _options(args: argparse.Namespace) -> DistOptions:
    if args.input is None or args.input.suffix != ".json":
        raise ConfigError("--workers and --dry-run need a chunked --input DIR/metadata.json")
    missing = [flag for flag, value in (("--num-parts", args.num_parts), ("--out", args.out)) if value is None]
    if missing:
        raise ConfigError(f"partitioning needs {' and '.join(missing)}")
    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {args.workers}")
    if args.num_parts < 1:
        raise ConfigError(f"--num-parts must be >= 1, got {args.num_parts}")
    if args.coarse_edges < 1:
        raise ConfigError(f"--coarse-edges must be >= 1, got {args.coarse_edges}")
    if not args.peer_timeout > 0:
        raise ConfigError(f"--peer-timeout must be > 0, got {args.peer_timeout}")
    if not args.message_mb > 0:
        raise ConfigError(f"--message-mb must be > 0, got {args.message_mb}")
    if args.threads < 0:
        raise ConfigError(f"--threads must be >= 0, got {args.threads}")
    if args.method not in DIST_METHODS:
        raise ConfigError(f"--method {args.method} is not available with --workers; use {', '.join(DIST_METHODS)}")
    unsupported = [
        flag
        for flag, on in (
            ("--balance-train", args.balance_train),
            ("--balance-edges", args.balance_edges),
            ("--halo-hops > 1", args.halo_hops != 1),
            ("--undirected", args.undirected),
        )
        if on
    ]
    if unsupported:
        raise ConfigError(f"{', '.join(unsupported)} need the single-process tool (drop --workers)")
    return DistOptions(
        input=args.input,
        num_parts=args.num_parts,
        out=args.out,
        method=args.method,
        graph_name=args.graph_name,
        seed=args.seed,
        overwrite=args.overwrite,
        message_mb=args.message_mb,
        coarse_edges=args.coarse_edges,
        renumber=args.renumber,
        threads=args.threads,
    )


def _estimates(opts: DistOptions, workers: int, base_bytes: int = BASE_BYTES):
    from distgnn.data.chunked import read_chunked_layout

    layout = read_chunked_layout(opts.input)
    check_chunking(layout)
    return layout, estimate_ranks(
        layout, workers, opts.num_parts, opts.method, opts.coarse_edges, opts.renumber, opts.message_mb, base_bytes
    )


def _print_estimates(estimates) -> None:
    print("rank | edges read | edges per part | nodes owned | feature chunk MiB | peak estimate GiB")
    for e in estimates:
        print(
            f"{e.rank:4d} | {e.edges_read:10,d} | {e.edges_per_part:14,d} | {e.nodes_owned:11,d} | "
            f"{e.largest_feature_chunk / (1 << 20):17.1f} | {e.peak_bytes / GIB:17.2f}"
        )


def _check_memory(need: int, what: str) -> None:
    have = available_bytes()
    if have is not None and need > have:
        raise ConfigError(
            f"{what} needs about {need / GIB:.1f} GiB but this machine has {have / GIB:.1f} GiB available; "
            "use more machines (--workers) or fewer ranks per machine"
        )


def run_workers(args: argparse.Namespace, argv: list[str]) -> int:
    opts = _options(args)
    workers = args.workers if args.workers is not None else int(os.environ.get("WORLD_SIZE", "1"))
    if args.dry_run:
        _, estimates = _estimates(opts, workers)
        _print_estimates(estimates)
        return 0
    if args.local:
        return _run_local(opts, workers, argv, args)
    return _run_rank(opts, workers, args)


def _run_local(opts: DistOptions, workers: int, argv: list[str], args: argparse.Namespace) -> NoReturn:
    """The W ranks on this host, forked from this process once it has imported torch.distributed: the
    import, most of a rank's start, happens once for the job instead of once per rank. A failed rank is
    named in one line and every other stopped (each removes its staging directory); Ctrl-C and SIGTERM
    stop them all; a rank whose launcher dies gets SIGTERM. Ends this process with the job's exit status."""
    layout, estimates = _estimates(opts, workers)
    check_output_dir(opts.out.resolve(), opts.graph_name or layout.graph_name, opts.overwrite)
    _check_memory(sum(e.peak_bytes for e in estimates), f"--local with {workers} ranks")
    import distgnn.partition.collective  # noqa: F401  (torch.distributed, inherited by every rank)

    env = {
        "WORLD_SIZE": str(workers),
        "LOCAL_WORLD_SIZE": str(workers),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    ranks = ForkedRanks(workers, env, lambda: _forked_rank(opts, workers, args), STOP_GRACE_S, log)
    code = ranks.run()
    if ranks.signal_received is not None:
        print("error: interrupted; no partition was written", file=sys.stderr)
    elif ranks.failed is not None:
        print(f"error: rank {ranks.failed} failed; every rank stopped, no partition was written", file=sys.stderr)
    # Like a finished rank, this process leaves without the interpreter's teardown of torch's modules.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _forked_rank(opts: DistOptions, workers: int, args: argparse.Namespace) -> int:
    """A rank forked by ``--local``: :func:`_run_rank`, its errors as one line and an exit code."""
    try:
        return _run_rank(opts, workers, args)
    except KeyboardInterrupt:
        print("error: interrupted; no partition was written", file=sys.stderr)
        return INTERRUPTED_EXIT
    except (DistGNNError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _terminate(signum, frame) -> None:
    # SIGTERM (a launcher or the scheduler stopping the job) unwinds like Ctrl-C, so the staging
    # directory is removed.
    raise KeyboardInterrupt


def _run_rank(opts: DistOptions, workers: int, args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, _terminate)
    from distgnn.partition.collective import RankGroup

    group = RankGroup(dead_after_s=args.peer_timeout)
    try:
        if group.world != workers:
            raise ConfigError(f"--workers {workers} but the job has WORLD_SIZE={group.world} ranks")
        # a rank counts its own start (the interpreter with torch and gloo) instead of the fixed base
        layout, estimates = _estimates(opts, group.world, resident_bytes() or BASE_BYTES)
        need = estimates[group.rank].peak_bytes * local_world_size()
        have = available_bytes() or need
        short = group.allgather(np.array([need, have], dtype=np.int64))
        worst = int(np.argmax(short[:, 0] - short[:, 1]))
        if short[worst, 0] > short[worst, 1]:
            raise ConfigError(
                f"rank {worst}'s machine needs about {short[worst, 0] / GIB:.1f} GiB for its ranks but has "
                f"{short[worst, 1] / GIB:.1f} GiB available; use more machines or fewer ranks per machine"
            )
        json_path, report = partition_distributed(opts, group)
        table = group.allgather(
            np.array(
                [
                    report.peak_rss_bytes,
                    estimates[group.rank].peak_bytes,
                    report.rounds,
                    report.bytes_sent,
                    int(report.seconds * 1000),
                ],
                dtype=np.int64,
            )
        )
        if group.rank == 0:
            print("rank | peak RSS GiB | estimate GiB | all-to-all rounds | sent MiB | seconds")
            for r, (peak, est, rounds, sent, ms) in enumerate(table.tolist()):
                print(
                    f"{r:4d} | {peak / GIB:12.2f} | {est / GIB:12.2f} | {rounds:17d} | {sent / (1 << 20):8.1f} | {ms / 1000:7.1f}"
                )
            print(f"wrote {json_path}")
        group.close()
        # A finished rank leaves without the interpreter's teardown of torch's modules, CPU time that
        # every rank would pay: what it wrote is closed and its output is flushed first.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    except (InputError, ConfigError) as exc:
        print(f"error: rank {group.rank}: {exc}", file=sys.stderr, flush=True)
        group.close(done=False)
        return 2
