"""DistNodeDataLoader: mini-batches of sampled blocks, with sampler worker processes.

The loader only orchestrates. It splits this trainer's seed ids into batches
(the same number on every trainer, agreed through torch.distributed, so DDP
never waits on a trainer that ran out of batches), and either samples them
inline (``num_workers=0``) or hands them to worker processes. A worker gets a
small picklable description (how to open the graph, the sampler's spec, the
seeds), opens its own connections, and samples the batches ``i`` with
``i % num_workers == worker_id`` into a bounded queue of its own; the loader
reads the queues round-robin, so batches come out in order and every run with
the same seed yields the same batches whatever the worker count.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import time
import traceback
import weakref
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from distgnn.errors import ConfigError, DistGNNError, InputError
from distgnn.sampling.block import Block
from distgnn.sampling.neighbor import NeighborSampler, derive_seed

log = logging.getLogger(__name__)

Batch = tuple[torch.Tensor, torch.Tensor, list[Block]]

_POLL_S = 0.5
_WORKER_START_TIMEOUT_S = 120.0


def agreed_num_batches(num_seeds: int, batch_size: int, drop_last: bool) -> int:
    """Batches per epoch that every trainer of the torch.distributed group agrees on.

    Without ``drop_last`` the trainer with the most seeds decides (the others
    make slightly smaller batches, so every seed is still seen once per epoch);
    with ``drop_last`` the one with the fewest (every batch is full).
    Collective: every trainer must call it, in the same order.
    """
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    count = torch.tensor([num_seeds], dtype=torch.int64)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(count, op=dist.ReduceOp.MIN if drop_last else dist.ReduceOp.MAX)
    total = int(count.item())
    return total // batch_size if drop_last else -(-total // batch_size)


@dataclass(frozen=True)
class BatchPlan:
    """How an epoch's seeds become batches; a pure function of its fields and the epoch."""

    seeds: np.ndarray
    num_batches: int
    batch_size: int
    shuffle: bool
    drop_last: bool
    seed: int

    def batches(self, epoch: int) -> list[np.ndarray]:
        order = self.seeds
        if self.shuffle:
            order = order[np.random.default_rng(derive_seed(self.seed, epoch)).permutation(len(order))]
        if self.drop_last:
            return [order[i * self.batch_size : (i + 1) * self.batch_size] for i in range(self.num_batches)]
        return np.array_split(order, self.num_batches) if self.num_batches else []

    def batch_rng_seed(self, epoch: int, index: int) -> int:
        return derive_seed(self.seed, epoch, index)


def graph_description(g) -> dict:
    """How a worker process opens ``g`` on its own: small and picklable."""
    describe = getattr(g, "worker_description", None)
    if describe is not None:
        return describe()
    from distgnn.graph import DistGraph

    if isinstance(g, DistGraph):
        return {"kind": "dist", **_dist_graph_description(g)}
    raise ConfigError(
        f"sampler workers cannot open a {type(g).__name__} on their own; use num_workers=0 with this graph"
    )


def _dist_graph_description(g) -> dict:
    ctx = g.context
    return {
        "env": ctx.config.to_env(),
        "graph_name": g.graph_name,
        "part_config": str(g._meta.json_path),
        "rank": ctx.rank,
        "world_size": ctx.world_size,
    }


def open_graph(description: dict):
    """The graph a worker samples from, opened from :func:`graph_description`'s output."""
    if description["kind"] != "dist":
        raise ConfigError(f"unknown graph description kind {description['kind']!r}")
    from distgnn.config import JobConfig
    from distgnn.context import connect
    from distgnn.graph import DistGraph

    config = JobConfig.from_env(description["env"])
    context = connect(config, description["rank"], description["world_size"])
    return DistGraph(description["graph_name"], part_config=description["part_config"], context=context)


def _worker_main(
    worker_id: int,
    num_workers: int,
    description: dict,
    sampler_spec: dict,
    plan: BatchPlan,
    commands: mp.Queue,
    out: mp.Queue,
    parent_pid: int,
) -> None:
    # Ctrl-C goes to the whole process group; the parent decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    try:
        g = open_graph(description)
        sampler = NeighborSampler.from_spec(sampler_spec)
        out.put(("ready", worker_id))
        while True:
            try:
                command = commands.get(timeout=_POLL_S)
            except queue.Empty:
                if os.getppid() != parent_pid:
                    return
                continue
            if command is None:
                return
            if command == "cancel":
                continue
            epoch = int(command)
            batches = plan.batches(epoch)
            for index in range(worker_id, len(batches), num_workers):
                if _cancelled(commands):
                    break
                batch = sampler.sample_blocks(g, batches[index], plan.batch_rng_seed(epoch, index))
                if not _put(out, ("batch", epoch, index, batch), commands, parent_pid):
                    break
            out.put(("end", epoch))
    except Exception:
        out.put(("error", worker_id, traceback.format_exc()))


def _cancelled(commands: mp.Queue) -> bool:
    try:
        command = commands.get_nowait()
    except queue.Empty:
        return False
    if command is None:
        commands.put(None)  # seen again by the main loop, which then exits
    return True


def _put(out: mp.Queue, item, commands: mp.Queue, parent_pid: int) -> bool:
    """Blocking put that gives up when the epoch is cancelled or the parent is gone."""
    while True:
        try:
            out.put(item, timeout=_POLL_S)
            return True
        except queue.Full:
            if os.getppid() != parent_pid or _cancelled(commands):
                return False


class _Workers:
    """The worker processes and their queues; stopping them is idempotent."""

    def __init__(self, num_workers: int, description: dict, sampler_spec: dict, plan: BatchPlan, prefetch: int):
        ctx = mp.get_context("spawn")
        self.commands = [ctx.Queue() for _ in range(num_workers)]
        self.outputs = [ctx.Queue(maxsize=max(1, prefetch)) for _ in range(num_workers)]
        self.procs = [
            ctx.Process(
                target=_worker_main,
                args=(w, num_workers, description, sampler_spec, plan, self.commands[w], self.outputs[w], os.getpid()),
                name=f"distgnn-sampler-{w}",
                daemon=True,
            )
            for w in range(num_workers)
        ]
        for proc in self.procs:
            proc.start()

    def get(self, worker: int, timeout_s: float):
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                item = self.outputs[worker].get(timeout=_POLL_S)
            except queue.Empty:
                proc = self.procs[worker]
                if not proc.is_alive():
                    raise DistGNNError(
                        f"sampler worker {worker} (pid {proc.pid}) died with exit code {proc.exitcode}"
                    ) from None
                if time.monotonic() > deadline:
                    raise DistGNNError(f"sampler worker {worker} sent nothing for {timeout_s:.0f}s") from None
                continue
            if item[0] == "error":
                raise DistGNNError(f"sampler worker {item[1]} failed:\n{item[2]}")
            return item

    def drain_epoch(self, epoch: int, timeout_s: float) -> None:
        """Cancel ``epoch`` and discard what workers still send until each ends it."""
        for commands in self.commands:
            commands.put("cancel")
        for worker in range(len(self.procs)):
            while True:
                item = self.get(worker, timeout_s)
                if item[0] == "end" and item[1] == epoch:
                    break

    def stop(self) -> None:
        for commands, proc in zip(self.commands, self.procs, strict=True):
            if proc.is_alive():
                with contextlib.suppress(OSError, ValueError):
                    commands.put(None)
        deadline = time.monotonic() + 5.0
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for q in self.commands + self.outputs:
            q.cancel_join_thread()
            q.close()


class DistNodeDataLoader:
    """Mini-batches ``(input_nodes, output_nodes, blocks)`` over this trainer's seeds.

    Args:
        g: a DistGraph (or InProcessGraph; then only ``num_workers=0``).
        nids: ``(N,)`` int64 global ids of this trainer's seed nodes (e.g. from node_split).
        sampler: a NeighborSampler.
        batch_size: seeds per batch (at most; see :func:`agreed_num_batches`).
        shuffle: reshuffle the seeds every epoch.
        drop_last: drop the incomplete last batch (every trainer then makes full batches only).
        num_workers: sampler processes; 0 samples in this process, when the batch is asked for.
        prefetch: batches each worker may have ready ahead of the trainer.
        device: where the blocks are put.
        seed: base seed of shuffling and sampling; with the same seed, rank and
            cluster shape, the batches are the same in every run.
        rank: this trainer's rank, mixed into the seed (torch.distributed's rank if None).
        timeout_s: how long to wait for a worker's next batch before giving up.

    Every trainer must construct its loader at the same point (the batch count
    is agreed collectively).
    """

    def __init__(
        self,
        g,
        nids: torch.Tensor | np.ndarray,
        sampler: NeighborSampler,
        batch_size: int,
        shuffle: bool = False,
        drop_last: bool = False,
        num_workers: int = 0,
        prefetch: int = 2,
        device: torch.device | str = "cpu",
        seed: int = 0,
        rank: int | None = None,
        timeout_s: float = 300.0,
    ):
        if isinstance(nids, torch.Tensor):
            nids = nids.detach().cpu().numpy()
        seeds = np.ascontiguousarray(nids, dtype=np.int64)
        if seeds.ndim != 1:
            raise InputError(f"nids must be a 1-D array of node ids, got shape {seeds.shape}")
        if num_workers < 0:
            raise ConfigError(f"num_workers must be >= 0, got {num_workers}")
        if rank is None:
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        self.g = g
        self.sampler = sampler
        self.device = torch.device(device)
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        num_batches = agreed_num_batches(len(seeds), batch_size, drop_last)
        self.plan = BatchPlan(seeds, num_batches, batch_size, shuffle, drop_last, derive_seed(seed, rank))
        self.epoch = 0
        self._workers: _Workers | None = None
        self._active_epoch: int | None = None
        if num_workers > 0:
            self._workers = _Workers(num_workers, graph_description(g), sampler.spec(), self.plan, prefetch)
            self._finalizer = weakref.finalize(self, self._workers.stop)
            for worker in range(num_workers):
                item = self._workers.get(worker, _WORKER_START_TIMEOUT_S)
                if item[0] != "ready":
                    raise DistGNNError(f"sampler worker {worker} sent {item[0]!r} before it was ready")

    def __len__(self) -> int:
        return self.plan.num_batches

    def __iter__(self) -> Iterator[Batch]:
        epoch = self.epoch
        self.epoch += 1
        if self._workers is None:
            return self._inline(epoch)
        return self._from_workers(epoch)

    def _inline(self, epoch: int) -> Iterator[Batch]:
        for index, seeds in enumerate(self.plan.batches(epoch)):
            yield self._to_device(self.sampler.sample_blocks(self.g, seeds, self.plan.batch_rng_seed(epoch, index)))

    def _from_workers(self, epoch: int) -> Iterator[Batch]:
        workers = self._workers
        if self._active_epoch is not None:
            # The previous epoch was left early: its workers must stop first.
            workers.drain_epoch(self._active_epoch, self.timeout_s)
        self._active_epoch = epoch
        for commands in workers.commands:
            commands.put(epoch)
        for index in range(self.plan.num_batches):
            item = workers.get(index % self.num_workers, self.timeout_s)
            if item[0] != "batch" or item[1] != epoch or item[2] != index:
                raise DistGNNError(f"sampler worker sent {item[:3]} where batch {index} of epoch {epoch} was due")
            yield self._to_device(item[3])
        for worker in range(self.num_workers):
            item = workers.get(worker, self.timeout_s)
            if item[:2] != ("end", epoch):
                raise DistGNNError(f"sampler worker {worker} sent {item[:3]} after the last batch of epoch {epoch}")
        self._active_epoch = None

    def _to_device(self, batch: Batch) -> Batch:
        input_nodes, output_nodes, blocks = batch
        if self.device.type == "cpu":
            return input_nodes, output_nodes, blocks
        non_blocking = True
        return (
            input_nodes.to(self.device, non_blocking=non_blocking),
            output_nodes.to(self.device, non_blocking=non_blocking),
            [b.to(self.device, non_blocking=non_blocking) for b in blocks],
        )

    def close(self) -> None:
        """Stop the worker processes (also done when the loader is garbage-collected or at exit)."""
        if self._workers is not None:
            self._finalizer()
            self._workers = None

    def __enter__(self) -> DistNodeDataLoader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
