"""A temporal training job: its flags, its plan and one trainer's start (the loop is :mod:`distgnn.temporal.loop`).

* :func:`add_temporal_args`: the stream (``--dataset events:PATH`` or ``synthetic-events:NODES:EVENTS``,
  ``--bipartite``), the model (PyG's TGN example's defaults), the i/j/k flags; the job, checkpoint and metrics
  flags come from distgnn's shared ones.
* :func:`prepare`: reads the stream and settles i/j/k (DistTGL's heuristic for unset ones) and rejects bad
  configurations, before any process starts.
* :func:`check_local`, :func:`start_trainer` and :func:`run_trainer` are the job's pieces for
  :func:`distgnn.train.job.main`: ``--local`` runs the trainers alone (no graph servers); a trainer joins the job's
  process group (or with ``--single`` runs alone).
* :func:`run_trainer`: one trainer: its memory copy's time segment, its epoch slot and share of each batch, DDP
  on weights (GPU trainers that each hold a memory copy: a GradSync all-reduce inside each captured step), Adam at ``--lr`` times :func:`~distgnn.temporal.parallel.lr_multiplier` (``--lr-scaling``). Under
  epoch parallelism (j > 1) an epoch of the job is one pass of the memory over the segment in which every batch
  is trained j times (:mod:`distgnn.temporal.parallel`); a checkpoint also holds each trainer's batch in
  flight. ``--evals-per-epoch N`` adds N - 1 validations inside each epoch (``eval`` records in metrics.jsonl
  with the training seconds so far; every validation, the epoch's own included, logs one).

Every machine holds the whole stream and its time-sorted CSR (as DistTGL replicates it), once, in shared memory
that its trainers map (:mod:`distgnn.temporal.shared`).
Memory copies get equal segments of the training batches: when the batch count is not a multiple of k, the
oldest ``batches mod k`` batches are left out, so that all trainers step in lockstep (DDP, checkpoints). Copy
c trains segment ``(c + epoch) mod k`` (DistTGL's staggered copies). At every epoch's start a copy's memory is
emptied, and a copy whose segment starts mid-stream replays the events before it through its memory only, with
the weights of the moment (:mod:`distgnn.temporal.warm`). So every copy trains on a warm memory written by the
weights it trains, and the copy evaluated (the one that just trained the last segment) has seen the whole
training stream.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from distgnn.data.datasets import DatasetSpec, load_dataset
from distgnn.data.events import EventStream, parse_columns
from distgnn.errors import ConfigError
from distgnn.nn.temporal import NodeMemory
from distgnn.temporal import parallel, shared
from distgnn.temporal.graph import TemporalCSR, build_temporal_csr
from distgnn.temporal.loop import TemporalLoop
from distgnn.temporal.plan import Plan
from distgnn.temporal.step import STEP_MODES
from distgnn.temporal.train import batch_ranges, chronological_split
from distgnn.train import job

log = logging.getLogger(__name__)


def add_temporal_args(parser: argparse.ArgumentParser) -> None:
    """The stream, model and parallelism flags of a temporal job."""
    data = parser.add_argument_group("event stream")
    data.add_argument(
        "--dataset",
        default="synthetic-events:2000:60000",
        help="events:PATH (CSV or SNAP whitespace; --columns or a header line names the columns) or\n"
        "synthetic-events:NODES:EVENTS (seeded by --seed)",
    )
    data.add_argument("--bipartite", action="store_true", help="renumber destinations after sources (JODIE)")
    data.add_argument(
        "--columns",
        type=parse_columns,
        help="events:PATH's columns by name, e.g. src,dst,weight,time (default: the file's header line; a\n"
        "headerless file of three columns is src,dst,time); columns other than src, dst, time and label are\n"
        "attributes: event features, standardised per column, carried by the TGN's messages",
    )
    model = parser.add_argument_group("model and optimiser (PyG's TGN example's defaults)")
    model.add_argument("--batch-size", type=int, default=200)
    model.add_argument("--lr", type=float, default=1e-4, help="Adam's learning rate of one trainer")
    model.add_argument(
        "--lr-scaling",
        choices=parallel.LR_SCALINGS,
        default="linear",
        help="--lr times the j*k batches one step averages (linear, DistTGL's rule; on CollegeMsg 2 and 4\n"
        "copies reach the single trainer's best sooner with it than with sqrt; docs/benchmarks-history.md), times its\n"
        "square root (sqrt), or as given (none)",
    )
    model.add_argument("--memory-dim", type=int, default=100)
    model.add_argument("--time-dim", type=int, default=100)
    model.add_argument("--embedding-dim", type=int, default=100)
    model.add_argument("--heads", type=int, default=2)
    model.add_argument("--neighbors", type=int, default=10, help="most recent neighbours per node")
    model.add_argument("--static-memory-dim", type=int, default=0, help="DistTGL's static node memory (0: off)")
    model.add_argument(
        "--time-encoding",
        choices=("fixed", "learned"),
        default="fixed",
        help="fixed: cos of TGN's log-spaced frequencies, not trained (GraphMixer's); learned: trained with\n"
        "the model (TGN's, PyG's). Learned runs can collapse in their third epoch, fixed ones did not\n"
        "(docs/benchmarks-history.md)",
    )
    model.add_argument(
        "--normalize-memory",
        action="store_true",
        help="the attention reads each node's memory row layer-normed (no parameters; the stored memory stays\n"
        "the GRU's output)",
    )
    model.add_argument(
        "--evals-per-epoch",
        type=int,
        default=1,
        metavar="N",
        help="validation N times an epoch, after equal shares of its steps (the last at its end); one before\n"
        "the end scores a scratch copy of the evaluating memory caught up to the end of the training events\n"
        "(memory only); its time is left out of the training seconds",
    )
    model.add_argument(
        "--patience",
        type=int,
        metavar="N",
        help="stop after N epochs in a row without a better validation AP (default: train every epoch); either\n"
        "way the result is the model of the best epoch by validation AP (weights and node memory, as TGN\n"
        "selects it), its figures val_ap, test_ap, test_auc, test_mrr, with the last epoch's as last_val_ap,\n"
        "last_test_ap",
    )
    model.add_argument(
        "--step",
        default="auto",
        choices=STEP_MODES,
        help="graph: replay each training step from a CUDA graph (on a GPU, one trainer per memory copy, no "
        "static memory; across copies the gradient all-reduce is inside the graph); "
        "eager: launch each op; auto: graph where it can run",
    )
    parallel.add_parallel_args(parser)


def load_stream(
    spec: str, bipartite: bool = False, seed: int = 0, columns: tuple[str, ...] | None = None
) -> EventStream:
    """The stream ``--dataset`` names (a dataset kind of :mod:`distgnn.data.datasets`), its columns named by
    ``columns`` (``--columns``)."""
    stream = load_dataset(DatasetSpec(spec, seed=seed, bipartite=bipartite, columns=columns))
    if not isinstance(stream, EventStream):
        raise ConfigError(f"--dataset {spec} is a graph, not an event stream: use events:PATH or synthetic-events:N:E")
    return stream


def prepare(args: argparse.Namespace) -> Plan:
    """Reads the stream and checks the parallelism against the job (raises InputError / ConfigError)."""
    if args.batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.evals_per_epoch < 1:
        raise ConfigError(f"--evals-per-epoch must be >= 1, got {args.evals_per_epoch}")
    if args.patience is not None and args.patience < 1:
        raise ConfigError(f"--patience must be >= 1 epoch, got {args.patience}")
    events, csr = _event_graph(args)
    train_end, val_end = chronological_split(len(events))
    train_batches = batch_ranges(0, train_end, args.batch_size)
    num_trainers = 1 if args.single else args.num_parts * args.trainers_per_machine
    num_machines = 1 if args.single else args.num_parts
    copy_bytes = NodeMemory.nbytes(events.num_nodes, args.memory_dim, events.feat_dim)
    chosen = parallel.from_args(args, num_trainers, num_machines, len(train_batches), copy_bytes)
    parallel.check(chosen.parallelism, num_trainers, len(train_batches), args.batch_size)
    return Plan(events, train_end, val_end, train_batches, chosen.parallelism, csr, chosen.reason)


def _event_graph(args: argparse.Namespace) -> tuple[EventStream, TemporalCSR | None]:
    """The stream and its CSR: a job's trainer maps its machine's shared copy (the machine's first trainer
    builds it); ``--single`` builds its own; the ``--local`` launcher only reads the stream to check it."""
    slot = None if args.local or args.single else shared.MachineSlot.from_env(os.environ)
    if slot is not None:
        key = f"{args.dataset} seed={args.seed} bipartite={args.bipartite} columns={args.columns}"
        graph = shared.machine_event_graph(
            slot, key, lambda: load_stream(args.dataset, args.bipartite, args.seed, args.columns)
        )
        return graph.events, graph.csr
    events = load_stream(args.dataset, args.bipartite, args.seed, args.columns)
    return events, None if args.local else build_temporal_csr(events)


def describe(plan: Plan, args: argparse.Namespace) -> str:
    heuristic = not (args.minibatch_parallelism or args.epoch_parallelism or args.memory_parallelism)
    origin = f"DistTGL's heuristic: {plan.reason}" if heuristic else "flags"
    multiplier = parallel.lr_multiplier(plan.parallelism, args.lr_scaling)
    return (
        f"temporal job: {len(plan.events)} events, {plan.events.num_nodes} nodes, "
        f"{len(plan.train_batches)} training batches of {args.batch_size}; parallelism "
        f"{plan.parallelism.describe()} from {origin}; lr {args.lr:g} x {multiplier:g} = {args.lr * multiplier:g} "
        f"(--lr-scaling {args.lr_scaling})"
    )


# -- the job's trainers -----------------------------------------------------------------------------


def check_local(args: argparse.Namespace) -> None:
    """``--local``, before any process starts: reads the stream and settles the plan (bad files and bad i/j/k
    stop here) and prints it. Returns None: the trainers run alone, each maps its machine's copy of the stream
    (:mod:`distgnn.temporal.shared`)."""
    print(describe(prepare(args), args), flush=True)


@dataclass
class TemporalTrainer:
    """This process's place in a temporal job: the plan, its device, rank and the number of trainers."""

    plan: Plan
    device: torch.device
    rank: int
    world_size: int


@contextlib.contextmanager
def start_trainer(args: argparse.Namespace) -> Iterator[TemporalTrainer]:
    """Trainer ``RANK`` of the job (torchrun's environment; its plan over its machine's stream), or with
    ``--single`` the whole job in this process (its plan printed); the process group is destroyed on leaving."""
    plan = prepare(args)
    if args.single:
        print(describe(plan, args), flush=True)
        job.configure_torch(args, 1)
        yield TemporalTrainer(plan, torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu"), 0, 1)
        return
    # CPU trainers: the memory groups and DDP run over gloo; GPU trainers all-reduce gradients over NCCL.
    device = job.join_process_group(args, backend="gloo" if args.device != "cuda" else None)
    try:
        yield TemporalTrainer(plan, device, dist.get_rank(), dist.get_world_size())
    finally:
        dist.destroy_process_group()


def run_trainer(trainer: TemporalTrainer, args: argparse.Namespace) -> dict:
    """Trains (and evaluates) as ``trainer``; returns the result fields (the same on every trainer)."""
    return TemporalLoop(args, trainer.plan, trainer.rank, trainer.world_size, trainer.device).run()
