"""The loaders' batch makers at work: sampler worker processes, one prefetch thread, and the CUDA-stream hand-off.

A worker process gets a small picklable description of the graph (:func:`graph_description`), the batch maker
and the batch plan; it opens its own connections (:func:`open_graph`) and makes the batches
``i`` with ``i % num_workers == worker_id`` into a bounded queue of its own (:func:`sample_loop`). The prefetch
thread runs the same loop in the trainer's process over the loader's own graph and sampler. :class:`Workers`
starts either, reads their queues with deadlines and stops them (also when a worker died).

A maker run on a CUDA side stream (:class:`OnStream`) marks each batch's end with an event; :func:`hand_over`
makes the consuming stream wait for it before the batch is read.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as mp

from distgnn.errors import ConfigError, DistGNNError
from distgnn.sampling.neighbor import NeighborSampler

POLL_S = 0.5
WORKER_START_TIMEOUT_S = 120.0
# While a prefetch thread of a GPU sampler runs, the interpreter's switch interval is at most this. The trainer's thread and the
# sampling thread share the GIL and both release it in every torch call; a thread whose call returns while the
# other holds the GIL otherwise waits for that one's next blocking call, or up to the default 5 ms.
PREFETCH_SWITCH_INTERVAL_S = 1e-4

# ``maker(g, sampler, batch_seeds, rng_seed) -> batch``: a picklable callable with a ``sampler_spec``.
BatchMakerFn = Callable[[Any, NeighborSampler, np.ndarray, int], Any]


def graph_description(g) -> dict:
    """How a worker process opens ``g`` on its own: small and picklable."""
    describe = getattr(g, "worker_description", None)
    if describe is not None:
        return describe()
    from distgnn.client.graph import DistGraph

    if isinstance(g, DistGraph):
        ctx = g.context
        return {
            "kind": "dist",
            "env": ctx.config.to_env(),
            "graph_name": g.graph_name,
            "part_config": str(g.part_config),
            "rank": ctx.rank,
            "world_size": ctx.world_size,
        }
    raise ConfigError(
        f"sampler workers cannot open a {type(g).__name__} on their own; use num_workers=0 with this graph"
    )


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


def worker_main(
    worker_id: int,
    num_workers: int,
    description: dict,
    maker: BatchMakerFn,
    plan,
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
    sample_loop(g, sampler, worker_id, num_workers, maker, plan, commands, out, lambda: os.getppid() == parent_pid)


def sample_loop(
    g,
    sampler: NeighborSampler,
    worker_id: int,
    num_workers: int,
    maker: BatchMakerFn,
    plan,
    commands,
    out,
    parent_alive: Callable[[], bool],
) -> None:
    """Make batches ``worker_id, worker_id + num_workers, ...`` of every epoch asked for on ``commands``.

    ``plan`` is a :class:`~distgnn.loader.base.BatchPlan`. Commands: ``(epoch, first batch index)``,
    ``"cancel"`` (stop the current epoch), ``None`` (exit). Puts ``("batch", epoch, index, batch)``, then
    ``("end", epoch)``, or ``("error", ...)``.
    """
    try:
        while True:
            try:
                command = commands.get(timeout=POLL_S)
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
            out.put(item, timeout=POLL_S)
            return True
        except queue.Full:
            if not parent_alive() or (commands is not None and _cancelled(commands)):
                return False


class Workers:
    """Sampler processes (or one in-process thread) and their queues; stopping is idempotent."""

    def __init__(self, num_workers: int, g, sampler: NeighborSampler, maker: BatchMakerFn, plan, prefetch: int):
        if num_workers == 0:
            self._start_thread(g, sampler, maker, plan, prefetch)
            return
        ctx = mp.get_context("spawn")
        self.commands = [ctx.Queue() for _ in range(num_workers)]
        self.outputs = [ctx.Queue(maxsize=max(1, prefetch)) for _ in range(num_workers)]
        description = graph_description(g)
        self.procs = [
            ctx.Process(
                target=worker_main,
                args=(w, num_workers, description, maker, plan, self.commands[w], self.outputs[w], os.getpid()),
                name=f"distgnn-sampler-{w}",
                daemon=True,
            )
            for w in range(num_workers)
        ]
        for proc in self.procs:
            proc.start()

    def _start_thread(self, g, sampler: NeighborSampler, maker: BatchMakerFn, plan, prefetch: int) -> None:
        # One thread in this process: sampling and fetching overlap the trainer's compute
        # (the C++ kernel, ZeroMQ waits and torch ops all release the GIL). Not a daemon: a
        # daemon thread still inside a GIL-releasing call when the interpreter finalizes is
        # killed by pthread_exit from a noexcept destructor, which aborts the whole process
        # ("terminate called without an active exception"). It ends by itself once the main
        # thread has (Python joins non-daemon threads before finalizing), also when the
        # loader was never closed.
        self.commands = [queue.Queue()]
        self.outputs = [queue.Queue(maxsize=max(1, prefetch))]
        # The loader's own sampler: a GPU sampler's placed partition is not made twice.
        args = (g, sampler, 0, 1, maker, plan, self.commands[0], self.outputs[0], threading.main_thread().is_alive)
        self.procs = [threading.Thread(target=sample_loop, args=args, name="distgnn-prefetch", daemon=False)]
        self.procs[0].start()
        if isinstance(maker, OnStream):  # a GPU sampler: measured there; a CPU sampler's thread keeps the default
            _short_switches.acquire()
            self._switches_held = True

    @property
    def count(self) -> int:
        return len(self.procs)

    def wait_ready(self) -> None:
        """Wait for every worker process to have opened its graph (a thread needs no wait)."""
        if isinstance(self.procs[0], threading.Thread):
            return
        for worker in range(self.count):
            item = self.get(worker, WORKER_START_TIMEOUT_S)
            if item[0] != "ready":
                raise DistGNNError(f"sampler worker {worker} sent {item[0]!r} before it was ready")

    def get(self, worker: int, timeout_s: float):
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                item = self.outputs[worker].get(timeout=POLL_S)
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
        if getattr(self, "_switches_held", False):
            self._switches_held = False
            _short_switches.release()
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


class _ShortSwitches:
    """Holds the switch interval at most :data:`PREFETCH_SWITCH_INTERVAL_S` while any prefetch thread of a GPU
    sampler runs, and restores the one found when the last stops."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders = 0
        self._saved = 0.0

    def acquire(self) -> None:
        with self._lock:
            if self._holders == 0:
                self._saved = sys.getswitchinterval()
                sys.setswitchinterval(min(self._saved, PREFETCH_SWITCH_INTERVAL_S))
            self._holders += 1

    def release(self) -> None:
        with self._lock:
            self._holders -= 1
            if self._holders == 0:
                sys.setswitchinterval(self._saved)


_short_switches = _ShortSwitches()


@dataclass(frozen=True)
class OnStream:
    """A batch maker that works on ``stream`` and marks each batch's end with an event (``batch.ready``)."""

    maker: BatchMakerFn
    stream: torch.cuda.Stream

    def __call__(self, g, sampler: NeighborSampler, seeds: np.ndarray, rng_seed: int):
        with torch.cuda.stream(self.stream):
            batch = self.maker(g, sampler, seeds, rng_seed)
            batch.ready = torch.cuda.Event()
            batch.ready.record(self.stream)
        return batch


def hand_over(batch):
    """``batch`` for the current stream of each CUDA device it is on. Made on a side stream (``batch.ready`` set),
    that stream waits for ``batch.ready``, and the caching allocator keeps the batch's memory until that stream is
    past its uses; made on the current stream (``batch.ready`` None), it is returned as it is."""
    if batch.ready is None:
        return batch
    consumers: dict[torch.device, torch.cuda.Stream] = {}
    for tensor in batch.tensors():
        if not tensor.is_cuda:
            continue
        consumer = consumers.get(tensor.device)
        if consumer is None:
            consumer = consumers[tensor.device] = torch.cuda.current_stream(tensor.device)
            consumer.wait_event(batch.ready)
        tensor.record_stream(consumer)
    return batch
