"""One trainer's loop of a temporal job: the model, its Adam and this trainer's memory copy; its epochs over the
plan's segments (DistTGL's parallelisms, :mod:`distgnn.temporal.parallel`); checkpoints of named pieces and
metrics; model selection by validation AP (:class:`~distgnn.train.selection.BestEpoch`: the best epoch's weights
and evaluating memory kept, ``--patience`` stops); and the RESULT figures of the selected model and of the last
epoch. :func:`distgnn.temporal.job.run_trainer` runs a :class:`TemporalLoop` in each trainer.
"""

from __future__ import annotations

import argparse
import inspect
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from distgnn.errors import ConfigError
from distgnn.nn.temporal import TGN
from distgnn.temporal import checkpoint, parallel
from distgnn.temporal.epoch_parallel import StaggeredMemory, train_epoch_staggered
from distgnn.temporal.memory_group import MemoryGroup
from distgnn.temporal.plan import Plan
from distgnn.temporal.train import TGNRunner, batch_ranges, train_epoch
from distgnn.train.allocator import StepCollector
from distgnn.train.checkpoint import Position
from distgnn.train.grad_sync import GradSync
from distgnn.train.metrics import MetricsLogger, metrics_from_args
from distgnn.train.result import epoch_time_s
from distgnn.train.selection import BestEpoch, copy_weights

log = logging.getLogger(__name__)

# DDP's flag that stops the buffers' broadcast before every forward: torch 2.13 renamed it (the old name warns).
NO_BUFFER_SYNC = (
    {"forward_sync_buffers": False}
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
    else {"broadcast_buffers": False}
)


def adam(params: Iterable[torch.nn.Parameter], lr: float, device: torch.device, step: str) -> torch.optim.Adam:
    """The TGN's Adam: on the CPU the fused kernel (one pass over each of the ~30 small parameters, faster there
    than the multi-tensor update); on a GPU the multi-tensor update,
    with the step count on the device where the step may be captured in a CUDA graph (``step`` not eager)."""
    if device.type == "cpu":
        return torch.optim.Adam(params, lr=lr, fused=True)
    return torch.optim.Adam(params, lr=lr, foreach=True, capturable=step != "eager")


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


class TemporalLoop:
    """Trainer ``rank`` of ``world`` on ``device``: builds the model (the same initial weights everywhere, DDP on
    weights with several trainers), Adam at ``--lr`` times the parallelism's multiplier, its memory group and
    runner, and resumes from ``--resume``; :meth:`run` trains and returns the result fields (the same on every
    trainer)."""

    def __init__(self, args: argparse.Namespace, plan: Plan, rank: int, world: int, device: torch.device) -> None:
        self.args, self.plan, self.rank, self.world, self.device = args, plan, rank, world, device
        par = plan.parallelism
        self.copy, self.share = par.copy_of(rank), par.share_of(rank)
        self.model = _new_model(args, plan, device)
        self.net: torch.nn.Module = self.model
        # Trainers that each hold a memory copy on a GPU average their gradients with a GradSync over NCCL, inside
        # each step's CUDA graph; DDP (eager steps) elsewhere.
        self.grad_sync = _grad_sync(args, par, world, self.model, device)
        if world > 1 and self.grad_sync is None:
            if args.step == "graph":
                raise ConfigError(
                    "--step graph trains several trainers only when each holds its own memory copy on a GPU "
                    "(--memory-parallelism = trainers, --device cuda); pass --step auto"
                )
            # The buffers (the fixed time frequencies) never change: no broadcast of them before every forward.
            self.net = DistributedDataParallel(
                self.model, device_ids=[device.index] if device.type == "cuda" else None, **NO_BUFFER_SYNC
            )
        step_mode = args.step if world == 1 or self.grad_sync is not None else "eager"
        lr = args.lr * parallel.lr_multiplier(par, args.lr_scaling)
        self.optimizer = adam(self.model.parameters(), lr, device, step_mode)
        self.group = _group_of(plan, rank, self.model, device) if world > 1 else None
        # Trainers of one copy draw the same negatives (each takes its share); copies draw their own.
        self.runner = TGNRunner(
            self.model,
            plan.events,
            plan.csr,
            device,
            args.neighbors,
            seed=args.seed * 1000 + self.copy,
            group=self.group,
            step=step_mode,
            eval_seed=args.seed,
            grad_sync=self.grad_sync,
        )
        self._resume()
        self.metrics = metrics_from_args(args, rank)
        # The best epoch by validation AP: its weights, the evaluating memory as its training left it, its owner.
        self.selection: BestEpoch[tuple[dict, dict | None, int]] = BestEpoch(
            higher_is_better=True, patience=args.patience
        )
        self.epoch_times: list[float] = []
        self.prepared = False  # whether the replays and steps of the run's epochs have been captured
        self.trained_total = 0.0  # training seconds of the job so far, evaluations left out
        self.val: dict = {}
        self.test: dict = {}

    def _resume(self) -> None:
        args, plan, par = self.args, self.plan, self.plan.parallelism
        owned = {self.copy: self.runner.memory} if self.runner.memory is not None else {}
        meta = {
            "num_events": len(plan.events),
            "num_nodes": plan.events.num_nodes,
            "parallelism": [par.minibatch, par.epoch, par.memory],
            "time_encoding": args.time_encoding,  # the model's parameters differ (learned frequencies or none)
        }
        self.position = checkpoint.LoopPosition()
        held = checkpoint.HeldBatch(self.group, self.device) if par.epoch > 1 else None
        self.pieces = checkpoint.temporal_pieces(
            self.model, self.optimizer, self.runner.generator, owned, self.position, held
        )
        self.books = checkpoint.checkpointer_from_args(args, meta)
        self.start = self.books.resume(args.resume, self.pieces) if self.books else Position()
        if self.start.path and self.rank == 0:
            print(f"resumed from {self.start.path} (step {self.start.step})", flush=True)
        self.step = self.start.step

    def save(self, epoch: int, batch: int) -> None:
        self.position.epoch, self.position.batch = epoch, batch
        self.books.save(self.step, epoch, self.pieces)

    def run(self) -> dict:
        """Every epoch left: train, evaluate, log; stops early on ``--patience``. Returns the result fields. The
        captured steps are released at the end, also on failure (before the process group goes)."""
        try:
            return self._run()
        finally:
            self.runner.release_steps()

    def _run(self) -> dict:
        for epoch in range(self.start.epoch, self.args.epochs):
            trained_s = self.train_epoch(epoch)
            if not self.args.no_eval:
                self.evaluate_epoch(epoch)
            if self.metrics is not None:
                record = {"step": self.step, "epoch": epoch, "epoch_time_s": trained_s}
                record.update({f"val_{k}": v for k, v in self.val.items()})
                record.update({f"test_{k}": v for k, v in self.test.items()})
                self.metrics.log("epoch", record)
            if self.selection.should_stop:
                if self.rank == 0:
                    print(
                        f"no better validation AP in {self.args.patience} epochs: stopping after epoch {epoch}",
                        flush=True,
                    )
                break
        if self.metrics is not None:
            self.metrics.close()
        return self.result()

    def train_epoch(self, epoch: int) -> float:
        """Trains this trainer's segment of ``epoch`` (from the resumed batch, in the epoch resumed); returns its
        training seconds (0 when nothing was left to train)."""
        args, plan, par = self.args, self.plan, self.plan.parallelism
        segment = plan.segment_of(self.copy, epoch)
        batches = plan.segment(segment)
        first = self.start.batch if epoch == self.start.epoch else 0  # batches done (epoch parallelism: steps)
        length = parallel.steps_per_epoch(len(batches), par.epoch)
        if first >= length:
            return 0.0
        collector = StepCollector.from_args(args)  # Python's collector at the same steps on every trainer
        collector.start()  # before the clock: a process's first start freezes what exists (set-up, not training)
        began = time.perf_counter()
        try:
            # The first epoch this process trains captures what every later one replays (on a GPU).
            ahead = None if self.prepared else later_work(plan, self.copy, epoch, args.epochs)
            self.prepared = True
            if first == 0:
                if ahead is not None:
                    self.runner.prepare_replays(ahead.stops, args.batch_size)
                _start_segment(self.runner, plan, segment, epoch, args.batch_size)
            warm_s = time.perf_counter() - began
            # Where the evaluating copy's memory stands after a step: the end of the last batch written (batch t is
            # written at step t, under epoch parallelism too).
            evaluator_batches = plan.segment(plan.segment_of(plan.evaluator_copy(epoch), epoch))
            midway = _MidEpochValidation(
                set() if args.no_eval else mid_epoch_marks(length, args.evals_per_epoch),
                length,
                [end for _, end in evaluator_batches],
                par.owner_of(plan.evaluator_copy(epoch)),
                began,
                self.trained_total,
            )

            def on_step(index: int, loss: float | None) -> None:
                self._after_step(epoch, first + index + 1, loss, midway)
                collector.step_done()

            if par.epoch > 1:
                loss, timing = train_epoch_staggered(
                    self.runner,
                    batches,
                    self.optimizer,
                    self.net,
                    par,
                    self.rank,
                    self.group,
                    on_step,
                    start_step=first,
                )
            else:
                loss, timing = train_epoch(
                    self.runner,
                    batches[first:],
                    self.optimizer,
                    self.net,
                    on_step,
                    (self.share, par.minibatch),
                    reset=False,
                    lazy_loss=self.device.type == "cuda",
                )
        finally:
            collector.stop()
        capturing = time.perf_counter()
        if ahead is not None:
            self.runner.prepare_steps(self.optimizer, ahead.sizes)
        trained_s = warm_s + timing.seconds + time.perf_counter() - capturing - midway.eval_s
        self.epoch_times.append(trained_s)
        self.trained_total += trained_s
        if args.checkpoint_dir:
            self.save(epoch, length)
        if self.rank == 0:
            events_per_s = len(plan.train_batches) * args.batch_size / max(trained_s, 1e-9)
            print(
                f"epoch {epoch}: loss {loss:.4f}, {trained_s:.2f} s, {events_per_s:,.0f} events/s (all trainers)",
                flush=True,
            )
        return trained_s

    def _after_step(self, epoch: int, done: int, loss: float | None, midway: _MidEpochValidation) -> None:
        args = self.args
        self.step += 1
        if args.checkpoint_dir and args.checkpoint_every and self.step % args.checkpoint_every == 0:
            self.save(epoch, done)
        if self.metrics is not None and self.metrics.should_log_step(self.step):
            self.metrics.log_step(self.step, epoch, **({} if loss is None else {"loss": float(loss)}))
        if done in midway.marks:
            midway.validate(self.runner, self.plan, args, self.rank, self.world, done, epoch, self.step, self.metrics)

    def evaluate_epoch(self, epoch: int) -> None:
        """Validation and test after ``epoch``; the model selection sees its validation AP."""
        evaluator = self.plan.parallelism.owner_of(self.plan.evaluator_copy(epoch))
        # The evaluating memory as training left it: what the best epoch's model is evaluated from at the end.
        trained = self.runner.memory.state() if self.rank == evaluator else None
        self.val, self.test = _evaluate(self.runner, self.plan, self.args, self.rank, self.world, evaluator, last=False)
        if self.rank == 0:
            print(
                f"epoch {epoch}: val AP {self.val['ap']:.4f} AUC {self.val['auc']:.4f}, test AP {self.test['ap']:.4f}",
                flush=True,
            )
        self.selection.update(
            epoch, self.val["ap"], lambda kept=trained, owner=evaluator: (copy_weights(self.model), kept, owner)
        )
        if self.metrics is not None:
            record = {"step": self.step, "epoch": epoch, "fraction": 1.0, "train_s": self.trained_total}
            self.metrics.log("eval", record | {f"val_{k}": v for k, v in self.val.items()})

    def result(self) -> dict:
        """The result fields: the run's shape and speed, and after evaluations the selected model's figures
        (re-evaluated, with MRR) and the last epoch's."""
        args, plan, par = self.args, self.plan, self.plan.parallelism
        last_val, last_test = self.val, self.test
        val, test = self.val, self.test
        if self.selection.state is not None:
            val, test = _evaluate_best(self.runner, self.model, plan, args, self.rank, self.world, self.selection.state)
        epoch_time = epoch_time_s(self.epoch_times) or 0.0
        trained_events = sum(end - begin for begin, end in plan.train_batches[plan.first_trained_batch :])
        result = {
            "dataset": args.dataset,
            "device": str(self.device),
            "backend": dist.get_backend() if dist.is_initialized() else None,
            "num_events": len(plan.events),
            "num_trainers": self.world,
            "num_parts": 1 if args.single else args.num_parts,
            "minibatch_parallelism": par.minibatch,
            "epoch_parallelism": par.epoch,
            "memory_parallelism": par.memory,
            "epochs": args.epochs,
            "epoch_time_s": epoch_time,
            "epoch_times_s": [round(t, 4) for t in self.epoch_times],
            "events_per_s": trained_events / epoch_time if epoch_time else 0.0,
        }
        if not args.no_eval and self.selection.state is not None:
            result.update(
                epochs_trained=self.selection.last_epoch + 1,
                best_epoch=self.selection.best_epoch,
                val_ap=val["ap"],
                val_auc=val["auc"],
                test_ap=test["ap"],
                test_auc=test["auc"],
                test_mrr=test.get("mrr"),
                last_val_ap=last_val["ap"],
                last_test_ap=last_test["ap"],
            )
        return result


def _grad_sync(
    args: argparse.Namespace, par: parallel.Parallelism, world: int, model: TGN, device: torch.device
) -> GradSync | None:
    """The GradSync of a job whose trainers each hold a memory copy on a GPU (no mini-batch or epoch group) and
    may capture their steps (``--step`` not eager): rank 0's weights broadcast, the gradients one flat buffer
    all-reduced over NCCL (collective). None otherwise: one trainer, CPU trainers, groups, eager steps (DDP)."""
    if world == 1 or device.type != "cuda" or par.trainers_per_copy != 1 or args.step == "eager":
        return None
    return GradSync(model.parameters())


def _new_model(args: argparse.Namespace, plan: Plan, device: torch.device) -> TGN:
    torch.manual_seed(args.seed)  # identical initial weights everywhere
    return TGN(
        plan.events.num_nodes,
        plan.events.feat_dim,
        args.memory_dim,
        args.time_dim,
        args.embedding_dim,
        args.heads,
        args.static_memory_dim,
        learn_time=args.time_encoding == "learned",
        normalize_memory=args.normalize_memory,
    ).to(device)


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
    """The memory of this trainer's copy (on its owner) as the segment's first batch should find it, in every
    epoch: empty at the stream's start (segment 0); else the events before the segment replayed through an
    empty memory with the current weights (:meth:`~distgnn.temporal.train.TGNRunner.warm_memory`). A copy does
    not go on from the memory its previous segment left: that memory was written by the weights of an epoch
    before, and training on it gave two-copy runs more and deeper epochs whose test AP falls far below what
    their validation AP promises (docs/BENCHMARKS.md)."""
    stop = plan.segment(segment)[0][0] if segment > 0 else 0
    began = time.perf_counter()
    runner.warm_memory(stop, batch_size)
    if stop and runner.memory is not None:
        log.info("memory warmed over %d events in %.2f s (epoch %d)", stop, time.perf_counter() - began, epoch)


@dataclass(frozen=True)
class LaterWork:
    """What one memory copy meets in a run's epochs: the stops of the memory replays before its segments (0: a
    segment at the stream's start, no replay) and the sizes of its training batches."""

    stops: set[int]
    sizes: set[int]


def later_work(plan: Plan, copy: int, first_epoch: int, epochs: int) -> LaterWork:
    """The replays and batch sizes memory copy ``copy`` meets in epochs ``[first_epoch, epochs)``: on a GPU they
    are captured in the first of them (:meth:`~distgnn.temporal.train.TGNRunner.prepare_replays`,
    :meth:`~distgnn.temporal.train.TGNRunner.prepare_steps`), not each in the epoch that first meets it (the
    copies alternate segments, so each would meet its own in a different epoch)."""
    segments = {plan.segment_of(copy, epoch) for epoch in range(first_epoch, epochs)}
    stops = {plan.segment(segment)[0][0] if segment > 0 else 0 for segment in segments}
    sizes = {end - begin for segment in segments for begin, end in plan.segment(segment)}
    return LaterWork(stops, sizes)


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
