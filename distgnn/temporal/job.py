"""A temporal training job: flags and one trainer's loop with DistTGL's parallelisms.

* :func:`add_temporal_args`: the stream (``--dataset events:PATH`` or ``synthetic-events:NODES:EVENTS``,
  ``--bipartite``), the model (PyG's TGN example's defaults), the i/j/k flags; the job, checkpoint and metrics
  flags come from distgnn's shared ones.
* :func:`prepare`: reads the stream and settles i/j/k (DistTGL's heuristic for unset ones) and rejects bad
  configurations, before any process starts.
* ``--local`` runs the trainers alone through :func:`distgnn.train.job.run_local` (``part_config=None``).
* :func:`run_trainer`: one trainer: its memory copy's time segment, its epoch slot and share of each batch, DDP
  on weights, Adam at ``--lr`` times :func:`~distgnn.temporal.parallel.lr_multiplier` (``--lr-scaling``). Under
  epoch parallelism (j > 1) an epoch of the job is one pass of the memory over the segment in which every batch
  is trained j times (:mod:`distgnn.temporal.parallel`); a checkpoint also holds each trainer's batch in
  flight. ``--evals-per-epoch N`` adds N - 1 validations inside each epoch (``eval`` records in metrics.jsonl
  with the training seconds so far; every validation, the epoch's own included, logs one).

Every machine holds the whole stream and its time-sorted CSR (as DistTGL replicates it), once, in shared memory
that its trainers map (:mod:`distgnn.temporal.shared`).
Memory copies get equal segments of the training batches: when the batch count is not a multiple of k, the
oldest ``batches mod k`` batches are left out, so that all trainers step in lockstep (DDP, checkpoints). Copy
c trains segment ``(c + epoch) mod k``, so each copy's memory goes on from the end of the segment it trained
the epoch before into the next one (as DistTGL staggers its copies), and resets only when the copy wraps to
segment 0, the stream's start. In the first epoch a copy starting mid-stream first replays the events before
its segment through its memory only (:mod:`distgnn.temporal.warm`). So every copy trains on a warm memory, and
the copy evaluated (the one that just trained the last segment) has seen the whole training stream.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from distgnn.data.datasets import DatasetSpec, load_dataset
from distgnn.data.events import EventStream, parse_columns
from distgnn.errors import ConfigError
from distgnn.nn.temporal import TGN, NodeMemory
from distgnn.temporal import checkpoint, parallel, shared
from distgnn.temporal.epoch_parallel import StaggeredMemory, train_epoch_staggered
from distgnn.temporal.graph import TemporalCSR, build_temporal_csr
from distgnn.temporal.memory_group import MemoryGroup
from distgnn.temporal.parallel import Parallelism
from distgnn.temporal.step import STEP_MODES
from distgnn.temporal.train import TGNRunner, batch_ranges, chronological_split, train_epoch
from distgnn.temporal.warm import replay_memory
from distgnn.train import job
from distgnn.train.checkpoint import Position
from distgnn.train.metrics import MetricsLogger, metrics_from_args
from distgnn.train.result import epoch_time_s
from distgnn.train.selection import BestEpoch, copy_weights

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
        help="graph: replay each training step from a CUDA graph (one trainer on a GPU, no static memory); "
        "eager: launch each op; auto: graph where it can run",
    )
    parallel.add_parallel_args(parser)


def adam(params: Iterable[torch.nn.Parameter], lr: float, device: torch.device, step: str) -> torch.optim.Adam:
    """The TGN's Adam: on the CPU the fused kernel (one pass over each of the ~30 small parameters, faster there
    than the multi-tensor update); on a GPU the multi-tensor update,
    with the step count on the device where the step may be captured in a CUDA graph (``step`` not eager)."""
    if device.type == "cpu":
        return torch.optim.Adam(params, lr=lr, fused=True)
    return torch.optim.Adam(params, lr=lr, foreach=True, capturable=step != "eager")


def load_stream(
    spec: str, bipartite: bool = False, seed: int = 0, columns: tuple[str, ...] | None = None
) -> EventStream:
    """The stream ``--dataset`` names (a dataset kind of :mod:`distgnn.data.datasets`), its columns named by
    ``columns`` (``--columns``)."""
    stream = load_dataset(DatasetSpec(spec, seed=seed, bipartite=bipartite, columns=columns))
    if not isinstance(stream, EventStream):
        raise ConfigError(f"--dataset {spec} is a graph, not an event stream: use events:PATH or synthetic-events:N:E")
    return stream


@dataclass
class Plan:
    """What every trainer agrees on before starting: the stream, its split, the batches, the parallelism; and
    the stream's CSR (None in the ``--local`` launcher, which trains nothing)."""

    events: EventStream
    train_end: int
    val_end: int
    train_batches: list[tuple[int, int]]
    parallelism: Parallelism
    csr: TemporalCSR | None = None
    reason: str = "flags"  # why this parallelism (DistTGL's rule, or the flags)

    @property
    def first_trained_batch(self) -> int:
        """Index of the oldest batch trained: the ``batches mod k`` before it are left out."""
        return len(self.train_batches) % self.parallelism.memory

    def segment(self, index: int) -> list[tuple[int, int]]:
        """The training batches of time segment ``index`` (of k): equal segments (oldest leftover batches dropped)."""
        per_copy = len(self.train_batches) // self.parallelism.memory
        first = self.first_trained_batch + index * per_copy
        return self.train_batches[first : first + per_copy]

    def segment_of(self, copy: int, epoch: int) -> int:
        """The segment memory copy ``copy`` trains in ``epoch``: ``(copy + epoch) mod k``, so that each copy goes
        on, epoch after epoch, from where its memory stands (DistTGL's staggered copies)."""
        return (copy + epoch) % self.parallelism.memory

    def evaluator_copy(self, epoch: int) -> int:
        """The copy that trained the last segment in ``epoch``: its memory stands where validation starts."""
        k = self.parallelism.memory
        return (k - 1 - epoch) % k


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


# -- the local runner --------------------------------------------------------------------------------


# -- one trainer -------------------------------------------------------------------------------------


def _group_of(plan: Plan, rank: int, model: TGN, device: torch.device) -> MemoryGroup | StaggeredMemory | None:
    """The group of trainers sharing ``rank``'s memory copy (collective: every trainer creates every copy's
    group); under epoch parallelism wrapped in the :class:`StaggeredMemory` the runner reads through."""
    par = plan.parallelism
    if par.trainers_per_copy == 1:
        return None
    mine = None
    for copy in range(par.memory):
        ranks = par.ranks_of(copy)
        group = dist.new_group(ranks, backend="gloo")
        if copy == par.copy_of(rank):
            memory = model.new_memory(device) if rank == ranks[0] else None
            mine = MemoryGroup(ranks, group, memory, model.memory_dim, model.edge_dim)
    return StaggeredMemory(mine) if par.epoch > 1 else mine


def run_trainer(args: argparse.Namespace, plan: Plan) -> dict:
    """Trains (and evaluates) as trainer ``RANK`` of the job, or alone with ``--single``; returns the result
    fields (the same on every trainer)."""
    distributed = not args.single
    if distributed:
        device = job.join_process_group(args, backend="gloo")  # the memory groups and DDP both run over gloo
    else:
        job.configure_torch(args, 1)
        device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    try:
        return _train(args, plan, rank, world, device)
    finally:
        if distributed:
            dist.destroy_process_group()


def _train(args: argparse.Namespace, plan: Plan, rank: int, world: int, device: torch.device) -> dict:
    par, events = plan.parallelism, plan.events
    copy, share = par.copy_of(rank), par.share_of(rank)
    torch.manual_seed(args.seed)  # identical initial weights everywhere
    model = TGN(
        events.num_nodes,
        events.feat_dim,
        args.memory_dim,
        args.time_dim,
        args.embedding_dim,
        args.heads,
        args.static_memory_dim,
        learn_time=args.time_encoding == "learned",
    ).to(device)
    net: torch.nn.Module = model
    if world > 1:
        # The buffers (the fixed time frequencies) never change: no broadcast of them before every forward.
        net = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None, broadcast_buffers=False
        )
    if world > 1 and args.step == "graph":
        raise ConfigError("--step graph trains one process alone (DDP's all-reduce stays eager); pass --step auto")
    step = args.step if world == 1 else "eager"
    optimizer = adam(model.parameters(), args.lr * parallel.lr_multiplier(par, args.lr_scaling), device, step)
    group = _group_of(plan, rank, model, device) if world > 1 else None
    # Trainers of one copy draw the same negatives (each takes its share); copies draw their own.
    runner = TGNRunner(
        model,
        events,
        plan.csr,
        device,
        args.neighbors,
        seed=args.seed * 1000 + copy,
        group=group,
        step=step,
        eval_seed=args.seed,
    )
    owned = {copy: runner.memory} if runner.memory is not None else {}
    meta = {
        "num_events": len(events),
        "num_nodes": events.num_nodes,
        "parallelism": [par.minibatch, par.epoch, par.memory],
        "time_encoding": args.time_encoding,  # the model's parameters differ (learned frequencies or none)
    }
    position = checkpoint.LoopPosition()
    held = checkpoint.HeldBatch(group, device) if par.epoch > 1 else None
    pieces = checkpoint.temporal_pieces(model, optimizer, runner.generator, owned, position, held)
    books = checkpoint.checkpointer_from_args(args, meta)
    start = books.resume(args.resume, pieces) if books else Position()
    if start.path and rank == 0:
        print(f"resumed from {start.path} (step {start.step})", flush=True)
    root = args.checkpoint_dir

    def save(step: int, epoch: int, batch: int) -> None:
        position.epoch, position.batch = epoch, batch
        books.save(step, epoch, pieces)

    metrics = metrics_from_args(args, rank)
    # The best epoch by validation AP: its weights, the evaluating memory as its training left it, and its owner.
    selection: BestEpoch[tuple[dict, dict | None, int]] = BestEpoch(higher_is_better=True, patience=args.patience)
    step = start.step
    epoch_times, val, test = [], {}, {}
    trained_total = 0.0  # training seconds of the job so far, evaluations left out
    for epoch in range(start.epoch, args.epochs):
        segment = plan.segment_of(copy, epoch)
        batches = plan.segment(segment)
        first = start.batch if epoch == start.epoch else 0  # batches done (epoch parallelism: steps)
        length = parallel.steps_per_epoch(len(batches), par.epoch)
        evaluator = par.owner_of(plan.evaluator_copy(epoch))
        trained_s = 0.0
        if first < length:
            began = time.perf_counter()
            if first == 0:
                _start_segment(runner, plan, segment, epoch, args.batch_size)
            warm_s = time.perf_counter() - began
            # Where the evaluating copy's memory stands after a step: the end of the last batch written (batch t is
            # written at step t, under epoch parallelism too).
            evaluator_batches = plan.segment(plan.segment_of(plan.evaluator_copy(epoch), epoch))
            midway = _MidEpochValidation(
                set() if args.no_eval else mid_epoch_marks(length, args.evals_per_epoch),
                length,
                [end for _, end in evaluator_batches],
                evaluator,
                began,
                trained_total,
            )

            def on_step(index: int, loss: float | None, epoch: int = epoch, first: int = first, midway=midway) -> None:
                nonlocal step
                step += 1
                done = first + index + 1
                if root and args.checkpoint_every and step % args.checkpoint_every == 0:
                    save(step, epoch, done)
                if metrics is not None and metrics.should_log_step(step):
                    metrics.log_step(step, epoch, **({} if loss is None else {"loss": loss}))
                if done in midway.marks:
                    midway.validate(runner, plan, args, rank, world, done, epoch, step, metrics)

            if par.epoch > 1:
                loss, timing = train_epoch_staggered(
                    runner, batches, optimizer, net, par, rank, group, on_step, start_step=first
                )
            else:
                loss, timing = train_epoch(
                    runner, batches[first:], optimizer, net, on_step, (share, par.minibatch), reset=False
                )
            trained_s = warm_s + timing.seconds - midway.eval_s
            epoch_times.append(trained_s)
            trained_total += trained_s
            if root:
                save(step, epoch, length)
            if rank == 0:
                print(
                    f"epoch {epoch}: loss {loss:.4f}, {trained_s:.2f} s, "
                    f"{len(plan.train_batches) * args.batch_size / max(trained_s, 1e-9):,.0f} events/s (all trainers)",
                    flush=True,
                )
        if not args.no_eval:
            # The evaluating memory as training left it: what the best epoch's model is evaluated from at the end.
            trained = runner.memory.state() if rank == evaluator else None
            val, test = _evaluate(runner, plan, args, rank, world, evaluator, last=False)
            if rank == 0:
                print(
                    f"epoch {epoch}: val AP {val['ap']:.4f} AUC {val['auc']:.4f}, test AP {test['ap']:.4f}", flush=True
                )
            selection.update(epoch, val["ap"], lambda kept=trained, owner=evaluator: (copy_weights(model), kept, owner))
            if metrics is not None:
                record = {"step": step, "epoch": epoch, "fraction": 1.0, "train_s": trained_total}
                metrics.log("eval", record | {f"val_{k}": v for k, v in val.items()})
        if metrics is not None:
            record = {"step": step, "epoch": epoch, "epoch_time_s": trained_s}
            record.update({f"val_{k}": v for k, v in val.items()})
            record.update({f"test_{k}": v for k, v in test.items()})
            metrics.log("epoch", record)
        if selection.should_stop:
            if rank == 0:
                print(f"no better validation AP in {args.patience} epochs: stopping after epoch {epoch}", flush=True)
            break
    if metrics is not None:
        metrics.close()
    last_val, last_test = val, test
    if selection.state is not None:
        val, test = _evaluate_best(runner, model, plan, args, rank, world, selection.state)
    epoch_time = epoch_time_s(epoch_times) or 0.0
    trained_events = sum(end - begin for begin, end in plan.train_batches[plan.first_trained_batch :])
    result = {
        "dataset": args.dataset,
        "device": str(device),
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "num_events": len(events),
        "num_trainers": world,
        "num_parts": 1 if args.single else args.num_parts,
        "minibatch_parallelism": par.minibatch,
        "epoch_parallelism": par.epoch,
        "memory_parallelism": par.memory,
        "epochs": args.epochs,
        "epoch_time_s": epoch_time,
        "epoch_times_s": [round(t, 4) for t in epoch_times],
        "events_per_s": trained_events / epoch_time if epoch_time else 0.0,
    }
    if not args.no_eval and selection.state is not None:
        result.update(
            epochs_trained=selection.last_epoch + 1,
            best_epoch=selection.best_epoch,
            val_ap=val["ap"],
            val_auc=val["auc"],
            test_ap=test["ap"],
            test_auc=test["auc"],
            test_mrr=test.get("mrr"),
            last_val_ap=last_val["ap"],
            last_test_ap=last_test["ap"],
        )
    return result


def _evaluate_best(
    runner: TGNRunner,
    model: TGN,
    plan: Plan,
    args: argparse.Namespace,
    rank: int,
    world: int,
    best: tuple[dict, dict | None, int],
) -> tuple[dict, dict]:
    """Validation and test (with MRR) of the best epoch's model: its weights on every trainer, its memory on the
    trainer that evaluated it."""
    weights, memory, evaluator = best
    model.load_state_dict(weights)
    if rank == evaluator:
        runner.memory.load_state(memory)
    return _evaluate(runner, plan, args, rank, world, evaluator, last=True)


def _start_segment(runner: TGNRunner, plan: Plan, segment: int, epoch: int, batch_size: int) -> None:
    """The memory of this trainer's copy (on its owner) as the segment's first batch should find it: empty at
    the stream's start (segment 0); in the first epoch, the events before the segment replayed through it
    (:func:`~distgnn.temporal.warm.replay_memory`); later, as the copy's previous segment, the one before this
    one, left it (nothing to do)."""
    if runner.memory is None or (segment > 0 and epoch > 0):
        return
    runner.reset_memory()
    if segment > 0:
        began = time.perf_counter()
        before = batch_ranges(0, plan.segment(segment)[0][0], batch_size)
        replay_memory(runner.model, runner.memory, runner.src, runner.dst, runner.time, runner.feat, before)
        log.info("memory warmed over %d events in %.2f s", before[-1][1], time.perf_counter() - began)


@dataclass
class _MidEpochValidation:
    """``--evals-per-epoch``'s validations inside one epoch of ``steps``: after the steps in ``marks``;
    ``batch_ends`` are the end events of the evaluating copy's batches this epoch; ``began`` is when the epoch
    started and ``trained_before`` the job's training seconds before it; ``eval_s`` sums the time they took."""

    marks: set[int]
    steps: int
    batch_ends: list[int]
    evaluator: int
    began: float
    trained_before: float
    eval_s: float = 0.0

    def validate(
        self,
        runner: TGNRunner,
        plan: Plan,
        args: argparse.Namespace,
        rank: int,
        world: int,
        done: int,
        epoch: int,
        step: int,
        metrics: MetricsLogger | None,
    ) -> None:
        """Validates after step ``done`` of the epoch (collective), prints and logs an ``eval`` record."""
        now = time.perf_counter()
        stands_at = self.batch_ends[min(done, len(self.batch_ends)) - 1]
        catch_up = batch_ranges(stands_at, plan.train_end, args.batch_size)
        figures = _validate(runner, plan, args, rank, world, self.evaluator, catch_up)
        trained = self.trained_before + now - self.began - self.eval_s
        self.eval_s += time.perf_counter() - now
        if rank == 0:
            print(
                f"epoch {epoch} after {done}/{self.steps} steps: val AP {figures['ap']:.4f} ({trained:.2f} training s; "
                f"memory caught up over {plan.train_end - stands_at} events)",
                flush=True,
            )
        if metrics is not None:
            record = {"step": step, "epoch": epoch, "fraction": done / self.steps, "train_s": trained}
            metrics.log("eval", record | {f"val_{k}": v for k, v in figures.items()})


def mid_epoch_marks(steps: int, evals_per_epoch: int) -> set[int]:
    """Steps (counted from 1) of an epoch of ``steps`` after which ``--evals-per-epoch`` validates before the
    epoch's end: after ``round(steps * n / N)`` for n = 1 .. N - 1 (the N-th is the epoch's own evaluation)."""
    marks = {round(steps * n / evals_per_epoch) for n in range(1, evals_per_epoch)}
    return {mark for mark in marks if 0 < mark < steps}


def _validate(
    runner: TGNRunner,
    plan: Plan,
    args: argparse.Namespace,
    rank: int,
    world: int,
    evaluator: int,
    catch_up: list[tuple[int, int]],
) -> dict[str, float]:
    """Validation mid-epoch on the evaluator, from a scratch copy of its memory caught up over ``catch_up`` (the
    training events it has not trained yet); the figures broadcast to every trainer."""
    figures = torch.zeros(2, dtype=torch.float64)
    if rank == evaluator:
        val = runner.evaluate(batch_ranges(plan.train_end, plan.val_end, args.batch_size), catch_up=catch_up)
        figures = torch.tensor([val["ap"], val["auc"]], dtype=torch.float64)
    if world > 1:
        dist.broadcast(figures, src=evaluator)
    return {"ap": float(figures[0]), "auc": float(figures[1])}


def _evaluate(
    runner: TGNRunner, plan: Plan, args: argparse.Namespace, rank: int, world: int, evaluator: int, last: bool
) -> tuple[dict, dict]:
    """Validation then test on the evaluator (the owner of the copy that trained the last segment); the figures
    broadcast to every trainer. MRR with ``last`` only, for the selected model (49 negatives per event cost many plain
    passes)."""
    figures = torch.zeros(5, dtype=torch.float64)
    if rank == evaluator:
        val = runner.evaluate(batch_ranges(plan.train_end, plan.val_end, args.batch_size))
        test = runner.evaluate(batch_ranges(plan.val_end, len(plan.events), args.batch_size), mrr=last)
        figures = torch.tensor(
            [val["ap"], val["auc"], test["ap"], test["auc"], test.get("mrr", float("nan"))], dtype=torch.float64
        )
    if world > 1:
        dist.broadcast(figures, src=evaluator)
    val = {"ap": float(figures[0]), "auc": float(figures[1])}
    test = {"ap": float(figures[2]), "auc": float(figures[3])}
    if last:
        test["mrr"] = float(figures[4])
    return val, test
