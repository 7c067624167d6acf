"""DistNodeDataLoader: mini-batches of sampled blocks over this trainer's seed nodes.

The loader only orchestrates (:class:`~distgnn.loader.base.BatchLoader`). It splits this trainer's seed ids into
batches (the same number on every trainer, agreed through torch.distributed, so DDP never waits on a trainer that
ran out of batches) and makes them inline when asked for (``num_workers=0``, the default), in one background
thread of the trainer (``num_workers=0, prefetch>0``: worth it where the trainer's compute leaves CPU idle, e.g.
on a GPU; on a box with few cores it competes with the compute), or in worker processes
(:mod:`distgnn.loader._workers`). A worker gets a small picklable description (how to open the graph, the
sampler's spec, the seeds), opens its own connections, and makes the batches ``i`` with
``i % num_workers == worker_id`` (sampling, then optionally fetching node features) into a bounded queue of its
own; the loader reads the queues round-robin, so batches come out in order and every run with the same seed
yields the same batches whatever the worker count.

A sampler on a CUDA device (``NeighborSampler(..., device="cuda")``) makes its
blocks on the GPU, inline or in the prefetch thread (not in worker processes,
whose queues carry CPU tensors); the fetched node data then follows them there.
Inline and in the prefetch thread it samples on a CUDA stream of its own (of the
highest priority, so its kernels go ahead of the step's): the
sampler's host syncs (it sizes its outputs) then wait for the sampling kernels
alone, not for the training step the trainer queued just before, so sampling
batch t+1 overlaps the GPU's work on batch t. A handed-out batch makes the
trainer's stream wait for its sampling, and its tensors are recorded on that
stream.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from distgnn.errors import ConfigError
from distgnn.loader.base import BatchLoader, LoaderOptions, check_node_data, fetch_rows
from distgnn.sampling.neighbor import NeighborSampler
from distgnn.sampling.source import as_node_ids, split_by_type


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
        input_data = {name: fetch_rows(g.ndata[name], input_nodes) for name in self.input_feats}
        output_data = {name: fetch_rows(g.ndata[name], output_nodes) for name in self.output_feats}
        timing = {"sample": sampled - start, "fetch": time.perf_counter() - sampled}
        return MiniBatch(input_nodes, output_nodes, blocks, input_data, output_data, timing)


class DistNodeDataLoader(BatchLoader):
    """Mini-batches ``(input_nodes, output_nodes, blocks)`` over this trainer's seeds.

    Args:
        g: a DistGraph (or InProcessGraph; then no worker processes).
        nids: ``(N,)`` int64 global ids of this trainer's seed nodes (e.g. from node_split), or on a
            heterogeneous graph ``{ntype: per-type ids}`` (batches then mix the types).
        sampler: a NeighborSampler.
        batch_size: seeds per batch (at most; see :func:`~distgnn.loader.base.agreed_num_batches`).
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
        options = LoaderOptions(batch_size, shuffle, drop_last, num_workers, prefetch, device, seed, rank, timeout_s)
        seeds = _seed_nodes(g, nids)
        if (input_feats or output_feats) and not g.get_partition_book().is_homogeneous:
            raise ConfigError("input_feats/output_feats fetch g.ndata, which a heterogeneous graph does not have")
        check_node_data(g, (*input_feats, *output_feats))
        maker = BatchMaker(sampler.spec(), tuple(input_feats), tuple(output_feats))
        super().__init__(g, sampler, maker, seeds, options)


def _seed_nodes(g, nids) -> np.ndarray:
    """``nids`` as homogeneous int64 ids: ``{ntype: per-type ids}`` on a heterogeneous graph, concatenated."""
    if not isinstance(nids, Mapping):
        return as_node_ids(nids, "nids")
    book = g.get_partition_book()
    return np.concatenate(
        [np.zeros(0, dtype=np.int64)]
        + [np.asarray(book.map_to_homo_nid(as_node_ids(ids, f"nids[{t!r}]"), t)) for t, ids in nids.items()]
    )
