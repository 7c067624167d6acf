"""What the node and edge loaders share: the options, the agreed batch count, the batch plan, and
:class:`BatchLoader`, which iterates a plan's batches inline or from :mod:`distgnn.loader._workers`.

A loader's seeds become the same number of batches on every trainer (agreed through torch.distributed, so DDP
never waits on a trainer that ran out of batches); the batches of an epoch are a pure function of the seeds, the
seed, the rank and the epoch, so every run with the same seed yields the same batches whatever the worker count.
A loader subclass only says how one batch is made (its maker).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from distgnn.errors import ConfigError, DistGNNError
from distgnn.loader._workers import BatchMakerFn, OnStream, Workers, hand_over
from distgnn.sampling.neighbor import NeighborSampler, derive_seed


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


@dataclass(frozen=True)
class LoaderOptions:
    """How a loader batches its seeds and where it makes the batches; see
    :class:`~distgnn.loader.node.DistNodeDataLoader` for each field. ``prefetch`` None: 2 with workers, 0
    (inline) without."""

    batch_size: int = 1
    shuffle: bool = False
    drop_last: bool = False
    num_workers: int = 0
    prefetch: int | None = None
    device: torch.device | str | None = None
    seed: int = 0
    rank: int | None = None
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.num_workers < 0 or self.prefetch_count < 0:
            raise ConfigError(
                f"num_workers and prefetch must be >= 0, got {self.num_workers} and {self.prefetch_count}"
            )

    @property
    def prefetch_count(self) -> int:
        if self.prefetch is None:
            return 2 if self.num_workers > 0 else 0
        return self.prefetch

    def check_sampler(self, sampler: NeighborSampler) -> None:
        """Raise ConfigError where ``sampler`` cannot run where these options make batches."""
        device = sampler_device(sampler)
        if self.num_workers > 0 and device.type == "cuda":
            raise ConfigError(
                f"a sampler on {device} cannot run in sampler worker processes (each would need its own "
                "CUDA context and copy of the graph, and their queues carry CPU tensors only); use num_workers=0, "
                "with prefetch > 0 to sample in a background thread"
            )


def sampler_device(sampler: NeighborSampler) -> torch.device:
    """Where ``sampler`` makes its blocks."""
    return sampler.device if sampler.device is not None else torch.device("cpu")


def check_node_data(g, names) -> None:
    """Raise ConfigError where ``g.ndata`` lacks one of ``names`` (the node data a loader is asked to fetch)."""
    for name in names:
        if name not in g.ndata:
            raise ConfigError(f"no node data {name!r} to fetch (have {sorted(g.ndata)})")


def fetch_rows(data, ids: torch.Tensor):
    """``data[ids]``, with the ids moved to a plain tensor's device first (a DistTensor takes any)."""
    if isinstance(data, torch.Tensor) and data.device != ids.device:
        ids = ids.to(data.device)
    return data[ids]


class BatchLoader:
    """Batches made by ``maker`` over ``seeds``, inline, in one prefetch thread or in sampler worker processes.

    ``maker(g, sampler, batch_seeds, rng_seed)`` makes one batch (with a ``sampler_spec``, from which a worker
    process rebuilds the sampler; picklable for workers); ``seeds`` are what the maker takes batches of (node
    ids, or positions of seed edges). Every trainer must construct its loader at the same point (the batch
    count is agreed collectively).
    """

    def __init__(self, g, sampler: NeighborSampler, maker: BatchMakerFn, seeds: np.ndarray, options: LoaderOptions):
        options.check_sampler(sampler)
        device = sampler_device(sampler)
        rank = options.rank
        if rank is None:
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        self.g = g
        self.sampler = sampler
        self.device = device if options.device is None else torch.device(options.device)
        self._sampler_device = device
        self.timeout_s = options.timeout_s
        num_batches = agreed_num_batches(len(seeds), options.batch_size, options.drop_last)
        self.plan = BatchPlan(
            seeds, num_batches, options.batch_size, options.shuffle, options.drop_last, derive_seed(options.seed, rank)
        )
        self.epoch = 0
        self._first_batch = 0  # of the next epoch (non-zero after load_state_dict mid-epoch)
        self._position = (0, 0)  # (epoch, batches handed out of it)
        self._workers: Workers | None = None
        self._active_epoch: int | None = None
        # GPU sampling in this process (inline or the prefetch thread) gets a stream of its own: the sampler's
        # host syncs then wait for the sampling kernels alone, not for the training step queued before. Its
        # priority is the highest: the GPU schedules the sampling kernels' blocks ahead of the step's, so each
        # sync returns after the sampling's own work and the step fills the time between them.
        self._stream = torch.cuda.Stream(device, priority=-1) if device.type == "cuda" else None
        self._maker = maker if self._stream is None else OnStream(maker, self._stream)
        if options.num_workers > 0 or options.prefetch_count > 0:
            # (Worker processes only take CPU samplers, so only the prefetch thread gets a maker on a stream.)
            self._workers = Workers(options.num_workers, g, sampler, self._maker, self.plan, options.prefetch_count)
            self._finalizer = weakref.finalize(self, self._workers.stop)
            self._workers.wait_ready()

    def __len__(self) -> int:
        return self.plan.num_batches

    def __iter__(self) -> Iterator:
        epoch, start = self.epoch, self._first_batch
        self.epoch += 1
        self._first_batch = 0
        self._position = (epoch, start)
        if self._workers is None:
            return self._inline(epoch, start)
        return self._from_workers(epoch, start)

    def state_dict(self) -> dict[str, int]:
        """Where the batches stand: ``{"epoch", "batch"}``, the epoch being iterated (or next, between epochs)
        and how many of its batches were handed out. JSON-able; see :meth:`load_state_dict`."""
        epoch, batch = self._position
        if epoch < self.epoch - 1 or batch >= self.plan.num_batches:
            epoch, batch = self.epoch, self._first_batch  # between epochs: the next one starts afresh
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
        self.epoch, self._first_batch, self._position = epoch, batch, (epoch, batch)

    def _inline(self, epoch: int, start: int) -> Iterator:
        batches = self.plan.batches(epoch)
        for index in range(start, len(batches)):
            batch = self._maker(self.g, self.sampler, batches[index], self.plan.batch_rng_seed(epoch, index))
            self._position = (epoch, index + 1)
            yield self._to_device(hand_over(batch))

    def _from_workers(self, epoch: int, start: int) -> Iterator:
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
            yield self._to_device(hand_over(item[3]))
        for worker in range(workers.count):
            item = workers.get(worker, self.timeout_s)
            if item[:2] != ("end", epoch):
                raise DistGNNError(f"sampler worker {worker} sent {item[:3]} after the last batch of epoch {epoch}")
        self._active_epoch = None

    def _to_device(self, batch):
        if self.device.type == "cpu" and self._sampler_device.type == "cpu":
            return batch
        if batch.ready is not None and all(t.device == self.device for t in batch.tensors()):
            return batch  # made on the device by a GPU sampler (and handed over): nothing to move
        # Tensors already there stay as they are; a copy back to the host must finish before it is read.
        return batch.to(self.device, non_blocking=self.device.type == "cuda")

    def close(self) -> None:
        """Stop the workers (also done when the loader is garbage-collected or at exit)."""
        if self._workers is not None:
            self._finalizer()
            self._workers = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
