"""A training loop's checkpoints and metrics, wired from the command line.

:func:`add_bookkeeping_args` gives a script the flags of checkpoints (:func:`add_checkpoint_args`) and :mod:`distgnn.train.metrics`
(``--checkpoint-dir --checkpoint-every --checkpoint-keep --resume --run-dir --metrics-every --tensorboard``).
A :class:`Bookkeeper` resumes from a checkpoint when it is made (rank 0 prints ``resumed from PATH (step N)``), says
which epochs and how many batches are left, and after each step and epoch logs metrics and saves checkpoints. Without ``--checkpoint-dir`` and
``--run-dir`` it does nothing but count steps. Every call is collective (made on every rank).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from distgnn.client.context import DistContext
from distgnn.client.embedding import DistEmbedding
from distgnn.client.graph import DistGraph
from distgnn.errors import ConfigError
from distgnn.train.allocator import StepCollector
from distgnn.train.checkpoint import Checkpointer, Position
from distgnn.train.checkpoint_pieces import training_pieces
from distgnn.train.epoch import EpochMeter, EpochSummary
from distgnn.train.metrics import RpcTraffic, add_metrics_args, metrics_from_args
from distgnn.train.timeline import Timeline


def add_checkpoint_args(parser: argparse.ArgumentParser) -> None:
    """``--checkpoint-dir D --checkpoint-every N --checkpoint-keep K --resume [auto|PATH]``."""
    group = parser.add_argument_group("checkpoints")
    group.add_argument(
        "--checkpoint-dir", default=None, help="where checkpoints go (shared, or the same path on every machine)"
    )
    group.add_argument("--checkpoint-every", type=int, default=0, help="save every N optimizer steps (0: never)")
    group.add_argument("--checkpoint-keep", type=int, default=2, help="checkpoints kept (the oldest are removed)")
    group.add_argument(
        "--resume",
        nargs="?",
        const="auto",
        default=None,
        metavar="auto|PATH",
        help="continue from the latest checkpoint in --checkpoint-dir if there is one (alone or 'auto'), or from a\n"
        "checkpoint's path",
    )


def checkpointer_from_args(args: argparse.Namespace, context: DistContext | None = None) -> Checkpointer | None:
    """The Checkpointer the flags of :func:`add_checkpoint_args` ask for (None without ``--checkpoint-dir``)."""
    if args.checkpoint_dir is None:
        if args.resume is not None or args.checkpoint_every:
            raise ConfigError("--resume and --checkpoint-every need --checkpoint-dir")
        return None
    return Checkpointer(args.checkpoint_dir, args.checkpoint_every, args.checkpoint_keep, context)


def add_bookkeeping_args(parser: argparse.ArgumentParser) -> None:
    """The checkpoint and metrics flags (see :func:`add_checkpoint_args`)."""
    add_checkpoint_args(parser)
    add_metrics_args(parser)


def check_bookkeeping_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject checkpoints in a ``--single`` run: a checkpoint holds a distributed job's state."""
    if getattr(args, "single", False) and args.checkpoint_dir:
        parser.error("--checkpoint-dir needs a distributed job (--local or distgnn-launch), not --single")


class Bookkeeper:
    """Resumes a loop from ``--resume`` and keeps its checkpoints and metrics.

    Build the model (DDP-wrapped or not), optimizers, embeddings and loader exactly as for a fresh run, then
    the Bookkeeper (it restores their state when resuming), then loop::

        for epoch in books.epochs(args.epochs):
            meter = books.meter(epoch, device, show_progress=...)
            for ... in meter.steps(loader, inputs):
                ...  # forward, backward, optimizer steps
                books.step_done(epoch, loss)
            books.epoch_done(meter.finish())

    Args:
        args: parsed flags of :func:`add_bookkeeping_args`.
        g: the job's graph (RPC traffic is counted for a DistGraph).
        model, optimizer, loader, sparse_optimizers, embeddings: what a checkpoint holds.
        batches_per_epoch: batches the loop takes per epoch (fewer than the loader's under a cap).
    """

    def __init__(
        self,
        args: argparse.Namespace,
        g: Any,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        loader: Any,
        batches_per_epoch: int,
        sparse_optimizers: Sequence[Any] = (),
        embeddings: Sequence[DistEmbedding] = (),
    ) -> None:
        self.checkpointer = checkpointer_from_args(args)
        self.metrics = metrics_from_args(args)
        self._traffic = RpcTraffic(g.context.client) if self.metrics and isinstance(g, DistGraph) else None
        self.pieces = training_pieces(model, optimizer, loader, sparse_optimizers, embeddings)
        self.batches_per_epoch = batches_per_epoch
        self._sync_timing = bool(getattr(args, "sync_timing", False))
        self._gc_every = StepCollector.from_args(args).every
        self.position = Position()
        if self.checkpointer:
            self.position = self.checkpointer.resume(args.resume, self.pieces, batches_per_epoch)
        self.step = self.position.step
        if self.position.path and (not dist.is_initialized() or dist.get_rank() == 0):
            print(f"resumed from {self.position.path} (step {self.step})", flush=True)

    def epochs(self, num_epochs: int) -> range:
        """The epochs still to run (all of them on a fresh start)."""
        return range(self.position.epoch, num_epochs)

    def batches_in(self, epoch: int) -> int:
        """Batches ``epoch`` still has: fewer in the epoch a checkpoint was taken in (the loader continues
        at the batch after it)."""
        return self.batches_per_epoch - (self.position.batch if epoch == self.position.epoch else 0)

    def meter(
        self, epoch: int, device: torch.device, show_progress: bool = False, timeline: Timeline | None = None
    ) -> EpochMeter:
        """The :class:`~distgnn.train.epoch.EpochMeter` of ``epoch``: its remaining batches, ``--sync-timing``,
        the ``--timeline`` that records its steps (None: none), and Python's garbage collection at fixed steps
        (:meth:`~distgnn.train.allocator.StepCollector.from_args`)."""
        return EpochMeter(
            epoch,
            self.batches_in(epoch),
            device,
            sync_timing=self._sync_timing,
            show_progress=show_progress,
            timeline=timeline,
            gc_every=self._gc_every,
        )

    def step_done(self, epoch: int, loss: torch.Tensor) -> None:
        """After a batch's optimizer steps: count it, log it every ``--metrics-every`` steps and save a
        checkpoint every ``--checkpoint-every`` steps. ``loss``: the batch's scalar loss."""
        self.step += 1
        if self.metrics and self.metrics.should_log_step(self.step):
            self.metrics.log_step(self.step, epoch, loss=float(loss.detach()))
        if self.checkpointer:
            self.checkpointer.maybe_save(self.step, epoch, self.pieces)

    def epoch_done(self, summary: EpochSummary) -> None:
        """After :meth:`~distgnn.train.epoch.EpochMeter.finish`: one epoch record (with the epoch's RPC bytes)."""
        if self.metrics:
            self.metrics.log_epoch(summary, self.step, self._traffic.take() if self._traffic else None)

    def close(self) -> None:
        if self.metrics:
            self.metrics.close()

    def __enter__(self) -> Bookkeeper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
