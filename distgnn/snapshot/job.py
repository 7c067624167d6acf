"""A snapshot-training job: its dataset flags, its trainers on this host, a trainer's process group.

Snapshot sequences are small next to their compute (every trainer reads the whole sequence and moves to its
device only the snapshots its plan gives it), so a job needs no graph servers: ``--local`` starts the
trainers alone through :func:`distgnn.train.job.run_local` (``part_config=None``); :func:`start_trainer` joins
torch.distributed. Under ``distgnn-launch`` the trainers find the same environment.

Datasets (``--dataset``): ``pyg-temporal:PATH`` (a PyTorch Geometric Temporal JSON file, node regression),
``events:PATH`` (an event stream cut by ``--snapshot-span`` or ``--num-snapshots``, next-snapshot links),
``synthetic`` (a skewed growing sequence, node regression).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from distgnn.data.events import read_events
from distgnn.errors import InputError
from distgnn.snapshot.events import snapshots_from_events
from distgnn.snapshot.pgt import read_pgt_json
from distgnn.snapshot.sequence import SnapshotSequence
from distgnn.snapshot.synthetic import synthetic_sequence
from distgnn.train import job
from distgnn.train.allocator import keep_freed_memory


def add_snapshot_dataset_args(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """``--dataset`` and how to frame or cut it."""
    group = parser.add_argument_group("snapshot dataset")
    group.add_argument("--dataset", default="synthetic", help="pyg-temporal:PATH | events:PATH | synthetic")
    group.add_argument("--lags", type=int, default=None, help="pyg-temporal: past steps as features (default: 4 or 8)")
    group.add_argument("--snapshot-span", type=float, default=None, help="events: seconds per snapshot")
    group.add_argument("--num-snapshots", type=int, default=None, help="events: snapshots of equal span")
    group.add_argument("--bipartite", action="store_true", help="events: sources and destinations are apart")
    group.add_argument("--synthetic-nodes", type=int, default=100_000)
    group.add_argument("--synthetic-snapshots", type=int, default=100)
    group.add_argument("--synthetic-degree", type=float, default=4.0)
    group.add_argument("--synthetic-features", type=int, default=4)
    return group


def load_sequence(args: argparse.Namespace) -> tuple[SnapshotSequence, str]:
    """The sequence ``--dataset`` names and its task (``node`` or ``link``).

    Raises:
        InputError: an unknown kind, or what the reader finds wrong.
    """
    kind, _, path = str(args.dataset).partition(":")
    if kind == "pyg-temporal" and path:
        return read_pgt_json(path, args.lags), "node"
    if kind == "events" and path:
        stream = read_events(path, bipartite=args.bipartite)
        return snapshots_from_events(stream, args.snapshot_span, args.num_snapshots, Path(path).stem), "link"
    if kind == "synthetic" and not path:
        seq = synthetic_sequence(
            args.synthetic_nodes,
            args.synthetic_snapshots,
            args.synthetic_features,
            args.synthetic_degree,
            seed=args.seed,
        )
        return seq, "node"
    raise InputError(f"--dataset {args.dataset!r}: expected pyg-temporal:PATH, events:PATH or synthetic")


def num_trainers(args: argparse.Namespace) -> int:
    return 1 if args.single else args.num_parts * args.trainers_per_machine


@dataclass
class SnapshotTrainer:
    """This process's place in the job: rank, world size, device, and whether it shows progress."""

    rank: int
    world_size: int
    device: torch.device
    show_progress: bool

    def result_fields(self, args: argparse.Namespace) -> dict:
        """The RESULT keys every example prints first: what ran, where (the trainers alone: one partition a
        machine) and for how many epochs."""
        return {
            "dataset": args.dataset,
            "device": str(self.device),
            "backend": dist.get_backend() if dist.is_initialized() else None,
            "num_trainers": self.world_size,
            "num_parts": 1 if args.single else args.num_parts,
            "epochs": args.epochs,
        }


@contextlib.contextmanager
def start_trainer(args: argparse.Namespace) -> Iterator[SnapshotTrainer]:
    """Join the job (torchrun's environment), or with ``--single`` run alone; ``--procs-per-gpu`` trainers
    share each GPU. On leaving, the trainers meet at a barrier (after success) and the group is destroyed."""
    if not args.no_malloc_tuning:
        keep_freed_memory()
    quiet = args.quiet or not (sys.stderr.isatty() or os.environ.get(job.STDERR_TTY_ENV) == "1")
    if args.single:
        job.configure_torch(args, 1)
        yield SnapshotTrainer(0, 1, torch.device(args.device), not quiet)
        return
    # gloo carries the hand-off and the gradient sum whichever way processes share a GPU (NCCL refuses two ranks
    # on one device).
    device = job.join_process_group(args, args.procs_per_gpu, "gloo" if args.procs_per_gpu > 1 else None)
    rank = dist.get_rank()
    try:
        yield SnapshotTrainer(rank, dist.get_world_size(), device, rank == 0 and not quiet)
        dist.barrier()
    finally:
        dist.destroy_process_group()
