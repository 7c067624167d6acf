"""DistEdgeDataLoader: mini-batches of seed edges for link prediction and edge-level training.

A batch is a set of this trainer's seed edges. Their endpoints (resolved once, when the
loader is built, see :func:`distgnn.sampling.edges.find_edges`) and the negative pairs a
:mod:`negative sampler <distgnn.sampling.negative>` draws for them make the output nodes:
the unique node ids of all pairs, in ascending order. The neighbour sampler builds the
blocks of those nodes, and the edges the model must not see (the seed edges, and with
``exclude="reverse_id"`` their reverses) are removed from every block. The pairs come as
:class:`PairGraph` objects whose ``src``/``dst`` are positions into the output nodes, so a
model's output rows score them directly.

Batching, worker processes, prefetching and the agreed batch count are the node loader's
(:class:`distgnn.dataloader.DistNodeDataLoader`); only the maker of a batch differs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from distgnn.dataloader import DistNodeDataLoader, _rows
from distgnn.errors import ConfigError, InputError
from distgnn.sampling.block import Block
from distgnn.sampling.edges import find_edges
from distgnn.sampling.exclude import drop_edges_from_blocks
from distgnn.sampling.negative import NegativeSampler
from distgnn.sampling.neighbor import NeighborSampler, derive_seed

EXCLUDE_MODES = (None, "self", "reverse_id")


@dataclass
class PairGraph:
    """Node pairs to score, as positions into a batch's output nodes.

    Attributes:
        src, dst: ``(P,)`` int64 positions into ``node_ids`` of each pair's endpoints.
        node_ids: ``(N_out,)`` int64 global ids of the output nodes (the last block's destinations).
        eids: ``(P,)`` int64 global edge ids of positive pairs; None for negative pairs.
    """

    src: torch.Tensor
    dst: torch.Tensor
    node_ids: torch.Tensor
    eids: torch.Tensor | None = None

    @property
    def num_edges(self) -> int:
        return int(self.src.shape[0])

    @property
    def num_nodes(self) -> int:
        return int(self.node_ids.shape[0])

    def edges(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(src, dst)`` positions, as DGL's ``graph.edges()``."""
        return self.src, self.dst

    def global_edges(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(src, dst)`` as global node ids."""
        return self.node_ids[self.src], self.node_ids[self.dst]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> PairGraph:
        def move(t):
            return None if t is None else t.to(device, non_blocking=non_blocking)

        return PairGraph(move(self.src), move(self.dst), move(self.node_ids), move(self.eids))


class EdgeMiniBatch(tuple):
    """``(input_nodes, pos_pair_graph, neg_pair_graph, blocks)``, or without a negative sampler
    ``(input_nodes, pair_graph, blocks)`` (as DistDGL's edge loader yields), plus fetched node data.

    ``input_data[name]`` holds ``g.ndata[name][input_nodes]`` for the loader's ``input_feats``;
    ``timing`` the seconds spent sampling (``"sample"``) and fetching (``"fetch"``).
    """

    input_data: dict[str, torch.Tensor]
    timing: dict[str, float]

    def __new__(cls, input_nodes, pos_graph, neg_graph, blocks, input_data=None, timing=None):
        items = (input_nodes, pos_graph, blocks) if neg_graph is None else (input_nodes, pos_graph, neg_graph, blocks)
        self = super().__new__(cls, items)
        self.input_data = dict(input_data or {})
        self.timing = dict(timing or {})
        self.ready: torch.cuda.Event | None = None  # as MiniBatch.ready: set when made on a side stream
        return self

    def tensors(self) -> Iterator[torch.Tensor]:
        """Every tensor the batch holds (ids, pair graphs, block arrays, node data), as MiniBatch.tensors."""
        yield self.input_nodes
        for pairs in (self.pos_graph, self.neg_graph):
            if pairs is not None:
                yield from (t for t in (pairs.src, pairs.dst, pairs.node_ids, pairs.eids) if t is not None)
        for block in self.blocks:
            yield from block.tensors()
        yield from self.input_data.values()

    @property
    def input_nodes(self) -> torch.Tensor:
        return self[0]

    @property
    def pos_graph(self) -> PairGraph:
        return self[1]

    @property
    def neg_graph(self) -> PairGraph | None:
        return self[2] if len(self) == 4 else None

    @property
    def blocks(self) -> list[Block]:
        return self[-1]

    def __reduce__(self):
        return EdgeMiniBatch, (
            self.input_nodes,
            self.pos_graph,
            self.neg_graph,
            self.blocks,
            self.input_data,
            self.timing,
        )

    def to(self, device: torch.device, non_blocking: bool = False) -> EdgeMiniBatch:
        neg = self.neg_graph
        return EdgeMiniBatch(
            self.input_nodes.to(device, non_blocking=non_blocking),
            self.pos_graph.to(device, non_blocking=non_blocking),
            None if neg is None else neg.to(device, non_blocking=non_blocking),
            [b.to(device, non_blocking=non_blocking) for b in self.blocks],
            {k: v.to(device, non_blocking=non_blocking) for k, v in self.input_data.items()},
            self.timing,
        )


@dataclass(frozen=True)
class EdgeBatchMaker:
    """Makes the batch of the seed edges at some positions: negatives, blocks, exclusion, node data.

    Attributes:
        sampler_spec: the neighbour sampler's spec (workers rebuild it from this).
        negative: the negative sampler, or None.
        exclude: one of :data:`EXCLUDE_MODES`.
        input_feats: ``g.ndata`` names fetched for the input nodes.
        eids, src, dst: ``(S,)`` int64 seed edge ids of this trainer and their endpoints.
        reverse: ``(S,)`` int64 id of each seed edge's reverse edge (with ``exclude="reverse_id"``).
    """

    sampler_spec: dict
    negative: NegativeSampler | None
    exclude: str | None
    input_feats: tuple[str, ...]
    eids: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    reverse: np.ndarray | None

    def __call__(self, g, sampler: NeighborSampler, positions: np.ndarray, rng_seed: int) -> EdgeMiniBatch:
        start = time.perf_counter()
        eids, src, dst = self.eids[positions], self.src[positions], self.dst[positions]
        ends = [src, dst]
        if self.negative is not None:
            # Its own stream: the blocks' streams (derived from rng_seed) stay those of a loader without negatives.
            neg_src, neg_dst = self.negative.sample(g, src, dst, np.random.default_rng(derive_seed(rng_seed, -1)))
            ends += [neg_src, neg_dst]
        nodes = np.unique(np.concatenate(ends))
        input_nodes, output_nodes, blocks = sampler.sample_blocks(g, nodes, rng_seed)
        if self.exclude is not None:
            excluded = eids if self.exclude == "self" else np.concatenate([eids, self.reverse[positions]])
            blocks = drop_edges_from_blocks(blocks, torch.from_numpy(excluded))
        output_cpu = torch.from_numpy(nodes)
        pos = PairGraph(_positions(nodes, src), _positions(nodes, dst), output_cpu, torch.from_numpy(eids))
        neg = None
        if self.negative is not None:
            neg = PairGraph(_positions(nodes, neg_src), _positions(nodes, neg_dst), output_cpu)
        sampled = time.perf_counter()
        input_data = {name: _rows(g.ndata[name], input_nodes) for name in self.input_feats}
        timing = {"sample": sampled - start, "fetch": time.perf_counter() - sampled}
        return EdgeMiniBatch(input_nodes, pos, neg, blocks, input_data, timing)


def _positions(sorted_nodes: np.ndarray, ids: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.searchsorted(sorted_nodes, ids).astype(np.int64))


def _as_edge_ids(eids, num_edges: int) -> np.ndarray:
    if isinstance(eids, torch.Tensor):
        eids = eids.detach().cpu().numpy()
    eids = np.asarray(eids)
    if eids.ndim != 1 or (eids.size and eids.dtype.kind not in "iu"):
        raise InputError(f"seed edge ids must be a 1-d integer tensor, got {eids.dtype}{list(eids.shape)}")
    eids = np.ascontiguousarray(eids, dtype=np.int64)
    if eids.size and (eids.min() < 0 or eids.max() >= num_edges):
        bad = eids[(eids < 0) | (eids >= num_edges)][0]
        raise InputError(f"seed edge id {int(bad)} out of range [0, {num_edges}) of the graph's edges")
    return eids


def _reverse_of(reverse_eids, eids: np.ndarray, num_edges: int) -> np.ndarray:
    """``reverse_eids[eids]`` as int64 numpy, with the mapping's length and values checked."""
    if reverse_eids is None:
        raise ConfigError(
            'exclude="reverse_id" needs reverse_eids: the id of each edge\'s reverse edge, (num_edges,) int64 '
            '(a tensor, or a DistTensor such as g.edata["reverse_eid"])'
        )
    if len(reverse_eids) != num_edges:
        raise InputError(f"reverse_eids must have one entry per edge ({num_edges},), got {len(reverse_eids)}")
    if isinstance(reverse_eids, np.ndarray):
        reverse_eids = torch.from_numpy(reverse_eids)
    reverse = reverse_eids[torch.from_numpy(eids)]
    reverse = reverse.detach().cpu().numpy() if isinstance(reverse, torch.Tensor) else np.asarray(reverse)
    if reverse.dtype.kind not in "iu":
        raise InputError(f"reverse_eids must hold integer edge ids, got {reverse.dtype}")
    reverse = reverse.astype(np.int64, copy=False)
    if reverse.size and (reverse.min() < 0 or reverse.max() >= num_edges):
        raise InputError(f"reverse_eids holds an edge id outside [0, {num_edges})")
    return reverse


class DistEdgeDataLoader(DistNodeDataLoader):
    """Mini-batches of this trainer's seed edges, with negative pairs and edge exclusion.

    Yields :class:`EdgeMiniBatch` ``(input_nodes, pos_pair_graph, neg_pair_graph, blocks)``
    (``(input_nodes, pair_graph, blocks)`` without a negative sampler): the output nodes are
    the unique endpoints of all pairs in ascending id order, ``blocks[-1]``'s destinations.

    Args:
        g: a DistGraph (or InProcessGraph; then no worker processes).
        eids: ``(S,)`` int64 global ids of this trainer's seed edges (e.g. from ``edge_split``).
        graph_sampler: a NeighborSampler.
        negative_sampler: a :class:`~distgnn.sampling.negative.NegativeSampler` (``Uniform(k)``,
            ``PerSourceUniform(k)``, ``DegreeBiased(k)``) or None.
        exclude: None; ``"self"`` (each batch's seed edges are removed from its blocks); or
            ``"reverse_id"`` (the seed edges and their reverse edges ``reverse_eids[eids]``).
            ``"reverse_types"`` is for heterogeneous graphs, not supported yet.
        reverse_eids: with ``"reverse_id"``: ``(num_edges,)`` int64 id of each edge's reverse, a
            tensor or a DistTensor (``g.edata["reverse_eid"]``); read once, for the seed edges only.
        batch_size, shuffle, drop_last, num_workers, prefetch, device, seed, rank, timeout_s:
            as :class:`~distgnn.dataloader.DistNodeDataLoader`.
        input_feats: ``g.ndata`` names fetched for each batch's input nodes (``batch.input_data``).

    Bad arguments raise before anything is sampled or any worker starts. Every trainer must
    build its loader at the same point (the batch count is agreed collectively).
    """

    def __init__(
        self,
        g,
        eids: torch.Tensor | np.ndarray,
        graph_sampler: NeighborSampler,
        negative_sampler: NegativeSampler | None = None,
        exclude: str | None = None,
        reverse_eids=None,
        batch_size: int = 1,
        shuffle: bool = False,
        drop_last: bool = False,
        num_workers: int = 0,
        prefetch: int | None = None,
        device: torch.device | str | None = None,
        seed: int = 0,
        rank: int | None = None,
        input_feats: tuple[str, ...] | list[str] = (),
        timeout_s: float = 300.0,
    ):
        num_edges = g.num_edges()
        seeds = _as_edge_ids(eids, num_edges)
        if negative_sampler is not None and not isinstance(negative_sampler, NegativeSampler):
            raise ConfigError(
                f"unknown negative sampler {negative_sampler!r}: pass a distgnn.sampling.negative sampler "
                "(Uniform, PerSourceUniform, DegreeBiased) or None"
            )
        if exclude == "reverse_types":
            raise ConfigError(
                'exclude="reverse_types" is for heterogeneous graphs, which this loader does not take yet'
            )
        if exclude not in EXCLUDE_MODES:
            raise ConfigError(f"exclude must be one of {EXCLUDE_MODES}, got {exclude!r}")
        if prefetch is None:
            prefetch = 2 if num_workers > 0 else 0
        if num_workers < 0 or prefetch < 0:
            raise ConfigError(f"num_workers and prefetch must be >= 0, got {num_workers} and {prefetch}")
        if num_workers > 0 and graph_sampler.device is not None and graph_sampler.device.type == "cuda":
            raise ConfigError(
                f"a sampler on {graph_sampler.device} cannot run in sampler worker processes; use num_workers=0"
            )
        for name in input_feats:
            if name not in g.ndata:
                raise ConfigError(f"no node data {name!r} to fetch (have {sorted(g.ndata)})")
        reverse = _reverse_of(reverse_eids, seeds, num_edges) if exclude == "reverse_id" else None
        src, dst = find_edges(g, seeds)
        maker = EdgeBatchMaker(
            graph_sampler.spec(),
            negative_sampler,
            exclude,
            tuple(input_feats),
            seeds,
            src.numpy(),
            dst.numpy(),
            reverse,
        )
        positions = np.arange(len(seeds), dtype=np.int64)
        self._start(
            g,
            graph_sampler,
            maker,
            positions,
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
