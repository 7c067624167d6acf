"""DistNodeDataLoader: mini-batches of sampled blocks, with sampler worker processes.

The loader only orchestrates. It splits this trainer's seed ids into batches
(the same number on every trainer, agreed through torch.distributed, so DDP
never waits on a trainer that ran out of batches) and hands them to worker
processes, or makes them inline when asked for (``num_workers=0``, the
default), or in one background thread of the trainer (``num_workers=0,
prefetch>0``: worth it where the trainer's compute leaves CPU idle, e.g. on a
GPU; on a box with few cores it competes with the compute). A worker gets a small
picklable description (how to open the graph, the sampler's spec, the seeds),
opens its own connections, and makes the batches ``i`` with
``i % num_workers == worker_id`` (sampling, then optionally fetching node
features) into a bounded queue of its own; the loader reads the queues
round-robin, so batches come out in order and every run with the same seed
yields the same batches whatever the worker count.

A sampler on a CUDA device (``NeighborSampler(..., device="cuda")``) makes its
blocks on the GPU, inline or in the prefetch thread (not in worker processes,
whose queues carry CPU tensors); the fetched node data then follows them there.
Inline and in the prefetch thread it samples on a CUDA stream of its own: the
sampler's host syncs (it sizes its outputs) then wait for the sampling kernels
alone, not for the training step the trainer queued just before, so sampling
batch t+1 overlaps the GPU's work on batch t. A handed-out batch makes the
trainer's stream wait for its sampling, and its tensors are recorded on that
stream.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import threading
import time
import traceback
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from distgnn.errors import ConfigError, DistGNNError
from distgnn.sampling.neighbor import NeighborSampler, as_node_ids, derive_seed, split_by_type

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
            # Shuffles a copy: the same order as indexing by permutation(len(order)), without the gather.
            order = np.random.default_rng(derive_seed(self.seed, epoch)).permutation(order)
        if self.drop_last:
            return [order[i * self.batch_size : (i + 1) * self.batch_size] for i in range(self.num_batches)]
        return np.array_split(order, self.num_batches) if self.num_batches else []

    def batch_rng_seed(self, epoch: int, index: int) -> int:
        return derive_seed(self.seed, epoch, index)


class MiniBatch(tuple):
    """``(input_nodes, output_nodes, blocks)``, plus node data fetched ahead of time.

    Unpacks like a 3-tuple. ``input_data[name]`` holds ``g.ndata[name][input_nodes]``
    for each name in the loader's ``input_feats``; ``output_data`` likewise for
    ``output_feats`` (e.g. labels). On a heterogeneous graph ``input_nodes`` and
    ``output_nodes`` are ``{ntype: per-type ids}``, each type's nodes in the order
    they have among the block's source (destination) nodes (see ``Block.src_ntypes``).
    """

    input_data: dict[str, torch.Tensor]
    output_data: dict[str, torch.Tensor]
    timing: dict[str, float]

    def __new__(cls, input_nodes, output_nodes, blocks, input_data=None, output_data=None, timing=None):
        self = super().__new__(cls, (input_nodes, output_nodes, blocks))
        self.input_data = dict(input_data or {})
        self.output_data = dict(output_data or {})
        self.timing = dict(timing or {})  # seconds spent making it: "sample", "fetch"
        self.ready: torch.cuda.Event | None = None  # made on a side stream: done when this event is
        return self

    def __reduce__(self):
        return MiniBatch, (*self, self.input_data, self.output_data, self.timing)

    def tensors(self) -> Iterator[torch.Tensor]:
        """Every tensor the batch holds (ids, block arrays, node data)."""
        input_nodes, output_nodes, blocks = self
        for nodes in (input_nodes, output_nodes):  # a tensor, or {ntype: tensor} on a heterogeneous graph
            yield from nodes.values() if isinstance(nodes, dict) else (nodes,)
        for block in blocks:
            yield from block.tensors()
        yield from self.input_data.values()
        yield from self.output_data.values()

    def to(self, device: torch.device, non_blocking: bool = False) -> MiniBatch:
        def move(t):
            if isinstance(t, dict):
                return {k: v.to(device, non_blocking=non_blocking) for k, v in t.items()}
            return t.to(device, non_blocking=non_blocking)

        input_nodes, output_nodes, blocks = self
        return MiniBatch(
            move(input_nodes),
            move(output_nodes),
            [b.to(device, non_blocking=non_blocking) for b in blocks],
            {k: move(v) for k, v in self.input_data.items()},
            {k: move(v) for k, v in self.output_data.items()},
            self.timing,
        )


@dataclass(frozen=True)
class BatchMaker:
    """Samples one batch and fetches its node data: the work of a worker or prefetch thread."""

    sampler_spec: dict
    input_feats: tuple[str, ...]
    output_feats: tuple[str, ...]

    def __call__(self, g, sampler: NeighborSampler, seeds: np.ndarray, rng_seed: int) -> MiniBatch:
        start = time.perf_counter()
        input_nodes, output_nodes, blocks = sampler.sample_blocks(g, seeds, rng_seed)
        book = g.get_partition_book()
        if not book.is_homogeneous:
            input_nodes = split_by_type(book, input_nodes)
            output_nodes = split_by_type(book, output_nodes)
        sampled = time.perf_counter()
        input_data = {name: _rows(g.ndata[name], input_nodes) for name in self.input_feats}
        output_data = {name: _rows(g.ndata[name], output_nodes) for name in self.output_feats}
        timing = {"sample": sampled - start, "fetch": time.perf_counter() - sampled}
        return MiniBatch(input_nodes, output_nodes, blocks, input_data, output_data, timing)


def _rows(data, ids: torch.Tensor):
    """``data[ids]``, with the ids moved to a plain tensor's device first (a DistTensor takes any)."""
    if isinstance(data, torch.Tensor) and data.device != ids.device:
        ids = ids.to(data.device)
    return data[ids]


def graph_description(g) -> dict:
    """How a worker process opens ``g`` on its own: small and picklable."""
    describe = getattr(g, "worker_description", None)
    if describe is not None:
        return describe()
    from distgnn.client.graph import DistGraph

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
        "part_config": str(g.part_config),
        "rank": ctx.rank,
        "world_size": ctx.world_size,
    }


def open_graph(description: dict):
    """The graph a worker samples from, opened from :func:`graph_description`'s output."""
    if description["kind"] != "dist":
        raise ConfigError(f"unknown graph description kind {description['kind']!r}")
    from distgnn.client.context import connect
    from distgnn.client.graph import DistGraph
    from distgnn.config import JobConfig

    config = JobConfig.from_env(description["env"])
    context = connect(config, description["rank"], description["world_size"])
    return DistGraph(description["graph_name"], part_config=description["part_config"], context=context)


def _worker_main(
    worker_id: int,
    num_workers: int,
    description: dict,
    maker: BatchMaker,
    plan: BatchPlan,
    commands: mp.Queue,
    out: mp.Queue,
    parent_pid: int,
) -> None:
    """Entry of a sampler worker process: open the graph, then serve epochs."""
    # Ctrl-C goes to the whole process group; the parent decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    try:
        g = open_graph(description)
        sampler = NeighborSampler.from_spec(maker.sampler_spec)
    except Exception:
        out.put(("error", worker_id, traceback.format_exc()))
        return
    out.put(("ready", worker_id))
    _sample_loop(g, sampler, worker_id, num_workers, maker, plan, commands, out, lambda: os.getppid() == parent_pid)


def _sample_loop(
    g,
    sampler: NeighborSampler,
    worker_id: int,
    num_workers: int,
    maker: BatchMaker,
    plan: BatchPlan,
    commands,
    out,
    parent_alive,
) -> None:
    """Make batches ``worker_id, worker_id + num_workers, ...`` of every epoch asked for on ``commands``.

    Commands: ``(epoch, first batch index)``, ``"cancel"`` (stop the current epoch), ``None`` (exit).
    Puts ``("batch", epoch, index, MiniBatch)``, then ``("end", epoch)``, or ``("error", ...)``.
    """
    try:
        while True:
            try:
                command = commands.get(timeout=_POLL_S)
            except queue.Empty:
                if not parent_alive():
                    return
                continue
            if command is None:
                return
            if command == "cancel":
                continue
            epoch, start = command
            batches = plan.batches(epoch)
            # This worker's batches are those with index % num_workers == worker_id, from ``start`` on.
            for index in range(start + (worker_id - start) % num_workers, len(batches), num_workers):
                if _cancelled(commands) or not parent_alive():
                    break
                batch = maker(g, sampler, batches[index], plan.batch_rng_seed(epoch, index))
                if not _put(out, ("batch", epoch, index, batch), commands, parent_alive):
                    break
            if not _put(out, ("end", epoch), None, parent_alive):
                return
    except Exception:
        _put(out, ("error", worker_id, traceback.format_exc()), None, parent_alive)


def _cancelled(commands: mp.Queue) -> bool:
    try:
        command = commands.get_nowait()
    except queue.Empty:
        return False
    if command is None:
        commands.put(None)  # seen again by the main loop, which then exits
    return True


def _put(out: mp.Queue, item, commands: mp.Queue | None, parent_alive) -> bool:
    """Blocking put that gives up when the parent is gone or (given ``commands``) the epoch is cancelled."""
    while True:
        try:
            out.put(item, timeout=_POLL_S)
            return True
        except queue.Full:
            if not parent_alive() or (commands is not None and _cancelled(commands)):
                return False


class _Workers:
    """Sampler processes (or one in-process thread) and their queues; stopping is idempotent."""

    def __init__(
        self, num_workers: int, g, sampler: NeighborSampler, maker: BatchMaker, plan: BatchPlan, prefetch: int
    ):
        if num_workers == 0:
            # One thread in this process: sampling and fetching overlap the trainer's compute
            # (the C++ kernel, ZeroMQ waits and torch ops all release the GIL). Not a daemon: a
            # daemon thread still inside a GIL-releasing call when the interpreter finalizes is
            # killed by pthread_exit from a noexcept destructor, which aborts the whole process
            # ("terminate called without an active exception"). It ends by itself once the main
            # thread has (Python joins non-daemon threads before finalizing), also when the
            # loader was never closed.
            self.commands = [queue.Queue()]
            self.outputs = [queue.Queue(maxsize=max(1, prefetch))]
            self.procs = [
                threading.Thread(
                    target=_sample_loop,
                    # The loader's own sampler: a GPU sampler's placed partition is not made twice.
                    args=(
                        g,
                        sampler,
                        0,
                        1,
                        maker,
                        plan,
                        self.commands[0],
                        self.outputs[0],
                        threading.main_thread().is_alive,
                    ),
                    name="distgnn-prefetch",
                    daemon=False,
                )
            ]
            self.procs[0].start()
            return
        ctx = mp.get_context("spawn")
        self.commands = [ctx.Queue() for _ in range(num_workers)]
        self.outputs = [ctx.Queue(maxsize=max(1, prefetch)) for _ in range(num_workers)]
        description = graph_description(g)
        self.procs = [
            ctx.Process(
                target=_worker_main,
                args=(w, num_workers, description, maker, plan, self.commands[w], self.outputs[w], os.getpid()),
                name=f"distgnn-sampler-{w}",
                daemon=True,
            )
            for w in range(num_workers)
        ]
        for proc in self.procs:
            proc.start()

    @property
    def count(self) -> int:
        return len(self.procs)

    def get(self, worker: int, timeout_s: float):
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                item = self.outputs[worker].get(timeout=_POLL_S)
            except queue.Empty:
                proc = self.procs[worker]
                if not proc.is_alive():
                    raise DistGNNError(
                        f"sampler worker {worker} ({proc.name}) stopped (exit code {getattr(proc, 'exitcode', None)})"
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
        for proc, out in zip(self.procs, self.outputs, strict=True):
            while proc.is_alive() and time.monotonic() < deadline:
                # Keep its queue empty so a final put cannot block it. Discarded items may fail to
                # unpickle (a tensor's file descriptor is gone with its exited sender): ignore that.
                with contextlib.suppress(Exception):
                    while True:
                        out.get_nowait()
                proc.join(0.05)
            if isinstance(proc, threading.Thread):
                continue
            if proc.is_alive():
                proc.terminate()
                proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for q in self.commands + self.outputs:
            if hasattr(q, "cancel_join_thread"):
                q.cancel_join_thread()
                q.close()


class DistNodeDataLoader:
    """Mini-batches ``(input_nodes, output_nodes, blocks)`` over this trainer's seeds.

    Args:
        g: a DistGraph (or InProcessGraph; then no worker processes).
        nids: ``(N,)`` int64 global ids of this trainer's seed nodes (e.g. from node_split), or on a
            heterogeneous graph ``{ntype: per-type ids}`` (batches then mix the types).
        sampler: a NeighborSampler.
        batch_size: seeds per batch (at most; see :func:`agreed_num_batches`).
        shuffle: reshuffle the seeds every epoch.
        drop_last: drop the incomplete last batch (every trainer then makes full batches only).
        num_workers: sampler processes. With 0, batches are made inline when asked
            for, or by one background thread of this process if ``prefetch > 0``
            (the only choices for a sampler on a CUDA device).
        prefetch: batches each worker (or the thread) may have ready ahead of the
            trainer; default 2 with workers, 0 (inline) without.
        device: where the batches are put; None: where the sampler makes the blocks
            (the CPU, or the sampler's device), fetched node data moved there too.
        seed: base seed of shuffling and sampling; with the same seed, rank and
            cluster shape, the batches are the same in every run, whatever
            ``num_workers`` and ``prefetch``.
        rank: this trainer's rank, mixed into the seed (torch.distributed's rank if None).
        input_feats, output_feats: names of ``g.ndata`` entries to fetch along with
            each batch, for its input and output nodes (found in the yielded
            :class:`MiniBatch`'s ``input_data`` / ``output_data``), so feature
            fetching overlaps training too.
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
        prefetch: int | None = None,
        device: torch.device | str | None = None,
        seed: int = 0,
        rank: int | None = None,
        input_feats: tuple[str, ...] | list[str] = (),
        output_feats: tuple[str, ...] | list[str] = (),
        timeout_s: float = 300.0,
    ):
        if isinstance(nids, Mapping):
            book = g.get_partition_book()
            seeds = np.concatenate(
                [np.zeros(0, dtype=np.int64)]
                + [np.asarray(book.map_to_homo_nid(as_node_ids(ids, f"nids[{t!r}]"), t)) for t, ids in nids.items()]
            )
        else:
            seeds = as_node_ids(nids, "nids")
        if (input_feats or output_feats) and not g.get_partition_book().is_homogeneous:
            raise ConfigError("input_feats/output_feats fetch g.ndata, which a heterogeneous graph does not have")
        if prefetch is None:
            prefetch = 2 if num_workers > 0 else 0
        if num_workers < 0 or prefetch < 0:
            raise ConfigError(f"num_workers and prefetch must be >= 0, got {num_workers} and {prefetch}")
        sampler_device = sampler.device if sampler.device is not None else torch.device("cpu")
        if num_workers > 0 and sampler_device.type == "cuda":
            raise ConfigError(
                f"a sampler on {sampler_device} cannot run in sampler worker processes (each would need its own "
                "CUDA context and copy of the graph, and their queues carry CPU tensors only); use num_workers=0, "
                "with prefetch > 0 to sample in a background thread"
            )
        for name in (*input_feats, *output_feats):
            if name not in g.ndata:
                raise ConfigError(f"no node data {name!r} to fetch (have {sorted(g.ndata)})")
        maker = BatchMaker(sampler.spec(), tuple(input_feats), tuple(output_feats))
        self._start(
            g,
            sampler,
            maker,
            seeds,
            batch_size,
            shuffle,
            drop_last,
            num_workers,
            prefetch,
            device,
            seed,
            rank,
            timeout_s,
        )

    def _start(
        self,
        g,
        sampler: NeighborSampler,
        maker,
        seeds: np.ndarray,
        batch_size: int,
        shuffle: bool,
        drop_last: bool,
        num_workers: int,
        prefetch: int,
        device: torch.device | str | None,
        seed: int,
        rank: int | None,
        timeout_s: float,
    ) -> None:
        """Agree on the batch count, plan the batches of ``seeds`` and start the workers that call ``maker``.

        ``maker(g, sampler, batch_seeds, rng_seed)`` makes one batch (a :class:`BatchMaker`, or another
        picklable maker with a ``sampler_spec``, such as the edge loader's).
        """
        sampler_device = sampler.device if sampler.device is not None else torch.device("cpu")
        if rank is None:
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        self.g = g
        self.sampler = sampler
        self.device = sampler_device if device is None else torch.device(device)
        self._sampler_device = sampler_device
        self.timeout_s = timeout_s
        num_batches = agreed_num_batches(len(seeds), batch_size, drop_last)
        self.plan = BatchPlan(seeds, num_batches, batch_size, shuffle, drop_last, derive_seed(seed, rank))
        self._maker = maker
        self.epoch = 0
        self._start = 0  # first batch of the next epoch (non-zero after load_state_dict mid-epoch)
        self._position = (0, 0)  # (epoch, batches handed out of it)
        self._workers: _Workers | None = None
        # GPU sampling in this process (inline or the prefetch thread) gets a stream of its own (module docstring).
        self._stream = torch.cuda.Stream(sampler_device) if sampler_device.type == "cuda" else None
        self._active_epoch: int | None = None
        if num_workers > 0 or prefetch > 0:
            maker = self._maker if self._stream is None else _OnStream(self._maker, self._stream)
            self._workers = _Workers(num_workers, g, sampler, maker, self.plan, prefetch)
            self._finalizer = weakref.finalize(self, self._workers.stop)
            for worker in range(num_workers):
                item = self._workers.get(worker, _WORKER_START_TIMEOUT_S)
                if item[0] != "ready":
                    raise DistGNNError(f"sampler worker {worker} sent {item[0]!r} before it was ready")

    def __len__(self) -> int:
        return self.plan.num_batches

    def __iter__(self) -> Iterator[MiniBatch]:
        epoch, start = self.epoch, self._start
        self.epoch += 1
        self._start = 0
        self._position = (epoch, start)
        if self._workers is None:
            return self._inline(epoch, start)
        return self._from_workers(epoch, start)

    def state_dict(self) -> dict[str, int]:
        """Where the batches stand: ``{"epoch", "batch"}``, the epoch being iterated (or next, between epochs)
        and how many of its batches were handed out. JSON-able; see :meth:`load_state_dict`."""
        epoch, batch = self._position
        if epoch < self.epoch - 1 or batch >= self.plan.num_batches:
            epoch, batch = self.epoch, self._start  # between epochs: the next one starts afresh
        return {"epoch": epoch, "batch": batch, "num_batches": self.plan.num_batches, "seed": self.plan.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Make the next ``iter(loader)`` yield epoch ``state["epoch"]`` from batch ``state["batch"]`` on: the
        same batches an uninterrupted loader would have yielded next (same seed, rank and seeds)."""
        if (state.get("num_batches"), state.get("seed")) != (self.plan.num_batches, self.plan.seed):
            raise ConfigError(
                f"loader state is for {state.get('num_batches')} batches per epoch with seed {state.get('seed')}, "
                f"this loader makes {self.plan.num_batches} with seed {self.plan.seed}: the seeds, batch size, seed "
                "or rank differ"
            )
        epoch, batch = int(state["epoch"]), int(state["batch"])
        if epoch < 0 or not 0 <= batch <= self.plan.num_batches:
            raise ConfigError(f"loader position epoch {epoch} batch {batch} is out of range")
        if batch == self.plan.num_batches:
            epoch, batch = epoch + 1, 0
        self.epoch, self._start, self._position = epoch, batch, (epoch, batch)

    def _inline(self, epoch: int, start: int) -> Iterator[MiniBatch]:
        batches = self.plan.batches(epoch)
        maker = self._maker if self._stream is None else _OnStream(self._maker, self._stream)
        for index in range(start, len(batches)):
            batch = maker(self.g, self.sampler, batches[index], self.plan.batch_rng_seed(epoch, index))
            self._position = (epoch, index + 1)
            yield self._to_device(batch if batch.ready is None else _hand_over(batch, batch.ready))

    def _from_workers(self, epoch: int, start: int) -> Iterator[MiniBatch]:
        workers = self._workers
        if self._active_epoch is not None:
            # The previous epoch was left early: its workers must stop first.
            workers.drain_epoch(self._active_epoch, self.timeout_s)
        self._active_epoch = epoch
        for commands in workers.commands:
            commands.put((epoch, start))
        for index in range(start, self.plan.num_batches):
            item = workers.get(index % workers.count, self.timeout_s)
            if item[0] != "batch" or item[1] != epoch or item[2] != index:
                raise DistGNNError(f"sampler worker sent {item[:3]} where batch {index} of epoch {epoch} was due")
            self._position = (epoch, index + 1)
            batch = item[3]
            yield self._to_device(batch if batch.ready is None else _hand_over(batch, batch.ready))
        for worker in range(workers.count):
            item = workers.get(worker, self.timeout_s)
            if item[:2] != ("end", epoch):
                raise DistGNNError(f"sampler worker {worker} sent {item[:3]} after the last batch of epoch {epoch}")
        self._active_epoch = None

    def _to_device(self, batch: MiniBatch) -> MiniBatch:
        if self.device.type == "cpu" and self._sampler_device.type == "cpu":
            return batch
        # Tensors already there stay as they are; a copy back to the host must finish before it is read.
        return batch.to(self.device, non_blocking=self.device.type == "cuda")

    def close(self) -> None:
        """Stop the workers (also done when the loader is garbage-collected or at exit)."""
        if self._workers is not None:
            self._finalizer()
            self._workers = None

    def __enter__(self) -> DistNodeDataLoader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass(frozen=True)
class _OnStream:
    """A BatchMaker that works on ``stream`` and marks each batch's end with an event (``batch.ready``)."""

    maker: BatchMaker
    stream: torch.cuda.Stream

    def __call__(self, g, sampler: NeighborSampler, seeds: np.ndarray, rng_seed: int) -> MiniBatch:
        with torch.cuda.stream(self.stream):
            batch = self.maker(g, sampler, seeds, rng_seed)
            batch.ready = torch.cuda.Event()
            batch.ready.record(self.stream)
        return batch


def _hand_over(batch: MiniBatch, ready: torch.cuda.Event) -> MiniBatch:
    """``batch``, made on a side stream, for the current stream of each CUDA device it is on: that stream waits
    for ``ready``, and the caching allocator keeps the batch's memory until that stream is past its uses."""
    consumers: dict[torch.device, torch.cuda.Stream] = {}
    for tensor in batch.tensors():
        if not tensor.is_cuda:
            continue
        consumer = consumers.get(tensor.device)
        if consumer is None:
            consumer = consumers[tensor.device] = torch.cuda.current_stream(tensor.device)
            consumer.wait_event(ready)
        tensor.record_stream(consumer)
    return batch
