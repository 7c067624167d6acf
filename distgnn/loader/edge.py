"""DistEdgeDataLoader: mini-batches of seed edges for link prediction and edge-level training.

A batch is a set of this trainer's seed edges. Their endpoints (resolved once, when the
loader is built, see :func:`distgnn.sampling.edges.find_edges`) and the negative pairs a
:mod:`negative sampler <distgnn.sampling.negative>` draws for them make the output nodes:
the unique node ids of all pairs, in ascending order. The neighbour sampler builds the
blocks of those nodes, and the edges the model must not see (the seed edges, and with
``exclude="reverse_id"`` their reverses) are removed from every block. The pairs come as
:class:`PairGraph` objects whose ``src``/``dst`` are positions into the output nodes, so a
model's output rows score them directly.

On a heterogeneous graph the seeds are ``{canonical etype: per-type edge ids}``. The output
nodes are still the unique homogeneous ids of all pairs, ascending, sampled by the typed
neighbour sampler (one call per layer for all types); the pairs come per edge type
(``{canonical etype: PairGraph}``, positions into the same output nodes), negatives of an
edge type take destinations of that type's destination node type, the input nodes come as
``{ntype: per-type ids}`` like the node loader's, and ``exclude="reverse_types"`` removes
each seed edge and every edge of its reverse type that joins the same two nodes the other
way (``reverse_etypes``), found once when the loader is built.

Batching, worker processes, prefetching and the agreed batch count are the node loader's
(both are :class:`distgnn.loader.base.BatchLoader`); only the maker of a batch differs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from distgnn.data.hetero import CanonicalEtype
from distgnn.errors import ConfigError, InputError
from distgnn.loader.base import BatchLoader, LoaderOptions, check_node_data, fetch_rows
from distgnn.partition.book import RangePartitionBook
from distgnn.sampling.block import Block
from distgnn.sampling.cpu import sample_layer
from distgnn.sampling.edges import find_edges
from distgnn.sampling.exclude import drop_edges_from_blocks
from distgnn.sampling.negative import NegativeSampler
from distgnn.sampling.neighbor import NeighborSampler, derive_seed
from distgnn.sampling.source import split_by_type

EXCLUDE_MODES = (None, "self", "reverse_id", "reverse_types")
# Seeds whose reverse edges one lookup call resolves (bounds the in-neighbourhoods held at once).
_REVERSE_LOOKUP_CHUNK = 1 << 16


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


PairGraphs = PairGraph | dict[CanonicalEtype, PairGraph]


def _pair_tensors(pairs: PairGraphs | None) -> Iterator[torch.Tensor]:
    for one in () if pairs is None else pairs.values() if isinstance(pairs, dict) else (pairs,):
        yield from (t for t in (one.src, one.dst, one.node_ids, one.eids) if t is not None)


def _move(value, device: torch.device | str, non_blocking: bool):
    """A tensor, PairGraph, or a dict of them, on ``device``."""
    if value is None:
        return None
    if isinstance(value, dict):
        return {k: v.to(device, non_blocking=non_blocking) for k, v in value.items()}
    return value.to(device, non_blocking=non_blocking)


class EdgeMiniBatch(tuple):
    """``(input_nodes, pos_pair_graph, neg_pair_graph, blocks)``, or without a negative sampler
    ``(input_nodes, pair_graph, blocks)`` (as DistDGL's edge loader yields), plus fetched node data.

    On a heterogeneous graph ``input_nodes`` is ``{ntype: per-type ids}`` (each type's nodes in the
    order they have among the first block's sources) and each pair graph is ``{canonical etype:
    PairGraph}`` with one entry per seed edge type (possibly empty), positions into the same output nodes.

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
        nodes = self.input_nodes
        yield from nodes.values() if isinstance(nodes, dict) else (nodes,)
        yield from _pair_tensors(self.pos_graph)
        yield from _pair_tensors(self.neg_graph)
        for block in self.blocks:
            yield from block.tensors()
        yield from self.input_data.values()

    @property
    def input_nodes(self) -> torch.Tensor | dict[str, torch.Tensor]:
        return self[0]

    @property
    def pos_graph(self) -> PairGraphs:
        return self[1]

    @property
    def neg_graph(self) -> PairGraphs | None:
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
        return EdgeMiniBatch(
            _move(self.input_nodes, device, non_blocking),
            _move(self.pos_graph, device, non_blocking),
            _move(self.neg_graph, device, non_blocking),
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
        eids, src, dst: ``(S,)`` int64 homogeneous seed edge ids of this trainer and their endpoints.
        excluded_ptr, excluded: the edges removed with each seed besides itself (its reverses) in CSR:
            seed ``i``'s are ``excluded[excluded_ptr[i]:excluded_ptr[i + 1]]``, ``(S + 1,)`` and ``(X,)``
            int64; None unless ``exclude`` is ``"reverse_id"`` or ``"reverse_types"``.
        etypes: on typed seeds, ``(S,)`` int64 edge type id of each seed, else None.
        pair_etypes: on typed seeds, the edge type ids that get a pair graph in every batch (in order).
        canonical_etypes: the graph's canonical edge types (the keys of the pair graphs).
    """

    sampler_spec: dict
    negative: NegativeSampler | None
    exclude: str | None
    input_feats: tuple[str, ...]
    eids: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    excluded_ptr: np.ndarray | None = None
    excluded: np.ndarray | None = None
    etypes: np.ndarray | None = None
    pair_etypes: tuple[int, ...] = ()
    canonical_etypes: tuple[CanonicalEtype, ...] = ()

    def __call__(self, g, sampler: NeighborSampler, positions: np.ndarray, rng_seed: int) -> EdgeMiniBatch:
        start = time.perf_counter()
        eids, src, dst = self.eids[positions], self.src[positions], self.dst[positions]
        etypes = None if self.etypes is None else self.etypes[positions]
        ends = [src, dst]
        if self.negative is not None:
            # Its own stream: the blocks' streams (derived from rng_seed) stay those of a loader without negatives.
            neg_rng = np.random.default_rng(derive_seed(rng_seed, -1))
            if etypes is None:
                neg_src, neg_dst = self.negative.sample(g, src, dst, neg_rng)
            else:
                neg_src, neg_dst, neg_etypes = self.negative.sample_typed(g, src, dst, etypes, neg_rng)
            ends += [neg_src, neg_dst]
        nodes = np.unique(np.concatenate(ends))
        input_nodes, output_nodes, blocks = sampler.sample_blocks(g, nodes, rng_seed)
        if self.exclude is not None:
            excluded = eids if self.excluded is None else np.concatenate([eids, self._excluded_with(positions)])
            blocks = drop_edges_from_blocks(blocks, torch.from_numpy(excluded))
        output_cpu = torch.from_numpy(nodes)
        if etypes is None:
            pos = PairGraph(_positions(nodes, src), _positions(nodes, dst), output_cpu, torch.from_numpy(eids))
            neg = None
            if self.negative is not None:
                neg = PairGraph(_positions(nodes, neg_src), _positions(nodes, neg_dst), output_cpu)
        else:
            input_nodes = split_by_type(g.get_partition_book(), input_nodes)
            pos = self._typed_pairs(nodes, output_cpu, src, dst, etypes, eids)
            neg = None
            if self.negative is not None:
                neg = self._typed_pairs(nodes, output_cpu, neg_src, neg_dst, neg_etypes, None)
        sampled = time.perf_counter()
        input_data = {name: fetch_rows(g.ndata[name], input_nodes) for name in self.input_feats}
        timing = {"sample": sampled - start, "fetch": time.perf_counter() - sampled}
        return EdgeMiniBatch(input_nodes, pos, neg, blocks, input_data, timing)

    def _excluded_with(self, positions: np.ndarray) -> np.ndarray:
        """The CSR segments of ``positions``, concatenated."""
        starts = self.excluded_ptr[positions]
        lengths = self.excluded_ptr[positions + 1] - starts
        offsets = np.cumsum(lengths) - lengths
        take = np.repeat(starts - offsets, lengths) + np.arange(int(lengths.sum()), dtype=np.int64)
        return self.excluded[take]

    def _typed_pairs(self, nodes, output_cpu, src, dst, etypes, eids) -> dict[CanonicalEtype, PairGraph]:
        pairs = {}
        for etype in self.pair_etypes:
            mine = etypes == etype  # order kept: a positive's negatives stay consecutive
            pairs[self.canonical_etypes[etype]] = PairGraph(
                _positions(nodes, src[mine]),
                _positions(nodes, dst[mine]),
                output_cpu,
                None if eids is None else torch.from_numpy(eids[mine]),
            )
        return pairs


def _positions(sorted_nodes: np.ndarray, ids: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.searchsorted(sorted_nodes, ids).astype(np.int64))


def _as_edge_ids(eids, num_edges: int, what: str = "") -> np.ndarray:
    if isinstance(eids, torch.Tensor):
        eids = eids.detach().cpu().numpy()
    eids = np.asarray(eids)
    label = f"seed edge ids {what}" if what else "seed edge ids"
    if eids.ndim != 1 or (eids.size and eids.dtype.kind not in "iu"):
        raise InputError(f"{label} must be a 1-d integer tensor, got {eids.dtype}{list(eids.shape)}")
    eids = np.ascontiguousarray(eids, dtype=np.int64)
    if eids.size and (eids.min() < 0 or eids.max() >= num_edges):
        bad = eids[(eids < 0) | (eids >= num_edges)][0]
        where = f"the edges {what}" if what else "the graph's edges"
        raise InputError(f"seed edge id {int(bad)} out of range [0, {num_edges}) of {where}")
    return eids


def _reverse_of(reverse_eids, eids: np.ndarray, num_edges: int) -> np.ndarray:
    """``reverse_eids[eids]`` as int64 numpy, with the mapping's length and values checked."""
    if reverse_eids is None:
        raise ConfigError(
            'exclude="reverse_id" needs reverse_eids: the id of each edge\'s reverse edge, (num_edges,) int64 '
            '(a tensor or a DistTensor), or an edge array g.edata["reverse_eid"], which this graph lacks'
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


def _typed_seeds(book: RangePartitionBook, eids: Mapping) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """``(homogeneous ids, edge type id of each, the seed edge type ids in order)`` of ``{etype: per-type ids}``."""
    homo, types, seen = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], []
    for etype, ids in eids.items():
        try:
            etype_id = book.etype_id(etype)
        except InputError as exc:
            raise InputError(f"seed edges: {exc}") from None
        if etype_id in seen:
            raise InputError(f"seed edges: edge type {etype!r} is given twice (as {book.canonical_etypes[etype_id]})")
        seen.append(etype_id)
        per_type = _as_edge_ids(ids, int(book.edges.type_counts[etype_id]), f"of type {etype!r}")
        homo.append(np.asarray(book.map_to_homo_eid(per_type, book.canonical_etypes[etype_id]), dtype=np.int64))
        types.append(np.full(len(per_type), etype_id, dtype=np.int64))
    return np.concatenate(homo), np.concatenate(types), tuple(seen)


def _reverse_etype_ids(book: RangePartitionBook, reverse_etypes, seed_etypes: tuple[int, ...]) -> np.ndarray:
    """``(R,)`` int64: the reverse edge type id of each edge type, -1 where it has none; checked."""
    if not isinstance(reverse_etypes, Mapping) or not reverse_etypes:
        raise ConfigError(
            'exclude="reverse_types" needs reverse_etypes: {etype: its reverse etype}, e.g. '
            '{"author:writes:paper": "paper:written_by:author"}'
        )
    reverse = np.full(len(book.canonical_etypes), -1, dtype=np.int64)
    for etype, rev in reverse_etypes.items():
        try:
            a, b = book.etype_id(etype), book.etype_id(rev)
        except InputError as exc:
            raise ConfigError(f"reverse_etypes {{{etype!r}: {rev!r}}}: {exc}") from None
        (s, _, d), (rs, _, rd) = book.canonical_etypes[a], book.canonical_etypes[b]
        if (rs, rd) != (d, s):
            raise ConfigError(
                f"reverse_etypes maps {s}:{_}:{d} to {rs}:{_}:{rd}, which does not lead back from {d} to {s}"
            )
        reverse[a] = b
    missing = [book.canonical_etypes[t] for t in seed_etypes if reverse[t] < 0]
    if missing:
        raise ConfigError(f"reverse_etypes names no reverse for the seed edge types {missing}")
    return reverse


def _reverse_edges_by_type(
    g, src: np.ndarray, dst: np.ndarray, etypes: np.ndarray, reverse_of: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The reverse edges of typed seed edges, in CSR over the seeds: for seed ``u -> v`` of type ``r``,
    every edge ``v -> u`` of type ``reverse_of[r]``.

    Found among the type-``reverse_of[r]`` in-edges of each ``u``: one typed full-neighbourhood sampling
    call (one request per machine) per chunk of seeds.
    Returns ``(ptr (S + 1,), edge ids (X,))`` int64.
    """
    book = g.get_partition_book()
    local, remote = g.sampling_view()
    all_types = [-1] * len(book.canonical_etypes)
    no_draws = [0] * book.num_partitions  # whole neighbourhoods: nothing is drawn at random
    counts = np.zeros(len(src), dtype=np.int64)
    found = [np.zeros(0, np.int64)]
    for start in range(0, len(src), _REVERSE_LOOKUP_CHUNK):
        end = min(start + _REVERSE_LOOKUP_CHUNK, len(src))
        nbr_counts, nbr_src, nbr_eids = sample_layer(
            book, local, remote, src[start:end], all_types, False, None, no_draws, reverse_of[etypes[start:end]]
        )
        hit = nbr_src == np.repeat(dst[start:end], nbr_counts)
        counts[start:end] = np.bincount(
            np.repeat(np.arange(end - start), nbr_counts)[hit], minlength=end - start
        ).astype(np.int64)
        found.append(nbr_eids[hit].astype(np.int64, copy=False))
    ptr = np.zeros(len(src) + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    return ptr, np.concatenate(found)


class DistEdgeDataLoader(BatchLoader):
    """Mini-batches of this trainer's seed edges, with negative pairs and edge exclusion.

    Yields :class:`EdgeMiniBatch` ``(input_nodes, pos_pair_graph, neg_pair_graph, blocks)``
    (``(input_nodes, pair_graph, blocks)`` without a negative sampler): the output nodes are
    the unique endpoints of all pairs in ascending id order, ``blocks[-1]``'s destinations.

    Args:
        g: a DistGraph (or InProcessGraph; then no worker processes).
        eids: ``(S,)`` int64 global ids of this trainer's seed edges (e.g. from ``edge_split``); on a
            heterogeneous graph ``{etype: (S_t,) per-type edge ids}`` (canonical triple, ``"src:rel:dst"``
            or a unique relation name): the batches then mix the types and the pair graphs are per type.
        graph_sampler: a NeighborSampler.
        negative_sampler: a :class:`~distgnn.sampling.negative.NegativeSampler` (``Uniform(k)``,
            ``PerSourceUniform(k)``, ``DegreeBiased(k)``; the first two on typed seeds) or None.
        exclude: None; ``"self"`` (each batch's seed edges are removed from its blocks); ``"reverse_id"``
            (the seed edges and their reverse edges ``reverse_eids[eids]``); or, on typed seeds,
            ``"reverse_types"`` (the seed edges and, for a seed ``u -> v`` of type ``r``, every edge
            ``v -> u`` of type ``reverse_etypes[r]``).
        reverse_eids: with ``"reverse_id"``: ``(num_edges,)`` int64 id of each edge's reverse, a
            tensor or a DistTensor; read once, for the seed edges only. Left out, the graph's own
            ``g.edata["reverse_eid"]`` is used (the partitioner keeps such an edge array in new ids).
        reverse_etypes: with ``"reverse_types"``: ``{etype: reverse etype}`` for every seed edge type.
        batch_size, shuffle, drop_last, num_workers, prefetch, device, seed, rank, timeout_s:
            as :class:`~distgnn.loader.node.DistNodeDataLoader`.
        input_feats: ``g.ndata`` names fetched for each batch's input nodes (``batch.input_data``).

    Bad arguments raise before anything is sampled or any worker starts. Every trainer must
    build its loader at the same point (the batch count is agreed collectively).
    """

    def __init__(
        self,
        g,
        eids: torch.Tensor | np.ndarray | Mapping,
        graph_sampler: NeighborSampler,
        negative_sampler: NegativeSampler | None = None,
        exclude: str | None = None,
        reverse_eids=None,
        reverse_etypes: Mapping | None = None,
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
        options = LoaderOptions(batch_size, shuffle, drop_last, num_workers, prefetch, device, seed, rank, timeout_s)
        book = g.get_partition_book()
        if isinstance(eids, Mapping):
            seeds, seed_etypes, pair_etypes = _typed_seeds(book, eids)
        else:
            seeds, seed_etypes, pair_etypes = _as_edge_ids(eids, g.num_edges()), None, ()
        _check_edge_options(negative_sampler, exclude, typed=seed_etypes is not None)
        reverse_of = _reverse_etype_ids(book, reverse_etypes, pair_etypes) if exclude == "reverse_types" else None
        options.check_sampler(graph_sampler)
        check_node_data(g, input_feats)
        if exclude == "reverse_id" and reverse_eids is None and "reverse_eid" in g.edata:
            reverse_eids = g.edata["reverse_eid"]
        reverse = _reverse_of(reverse_eids, seeds, g.num_edges()) if exclude == "reverse_id" else None
        src, dst = (t.numpy() for t in find_edges(g, seeds))
        excluded_ptr = excluded = None
        if reverse is not None:
            excluded_ptr, excluded = np.arange(len(seeds) + 1, dtype=np.int64), reverse
        elif reverse_of is not None:
            excluded_ptr, excluded = _reverse_edges_by_type(g, src, dst, seed_etypes, reverse_of)
        maker = EdgeBatchMaker(
            graph_sampler.spec(),
            negative_sampler,
            exclude,
            tuple(input_feats),
            seeds,
            src,
            dst,
            excluded_ptr,
            excluded,
            seed_etypes,
            pair_etypes,
            tuple(book.canonical_etypes),
        )
        super().__init__(g, graph_sampler, maker, np.arange(len(seeds), dtype=np.int64), options)


def _check_edge_options(negative_sampler, exclude: str | None, typed: bool) -> None:
    """Raise ConfigError where the negative sampler or the exclusion mode does not fit the seeds."""
    if negative_sampler is not None and not isinstance(negative_sampler, NegativeSampler):
        raise ConfigError(
            f"unknown negative sampler {negative_sampler!r}: pass a distgnn.sampling.negative sampler "
            "(Uniform, PerSourceUniform, DegreeBiased) or None"
        )
    if typed and negative_sampler is not None and not negative_sampler.typed:
        raise ConfigError(f"{negative_sampler!r} does not sample typed negatives; use Uniform or PerSourceUniform")
    if exclude not in EXCLUDE_MODES:
        raise ConfigError(f"exclude must be one of {EXCLUDE_MODES}, got {exclude!r}")
    if exclude == "reverse_types" and not typed:
        raise ConfigError(
            'exclude="reverse_types" needs typed seed edges {etype: ids} on a heterogeneous graph; '
            'use "reverse_id" with homogeneous seeds'
        )
    if exclude == "reverse_id" and typed:
        raise ConfigError('exclude="reverse_id" takes homogeneous seed edges; use "reverse_types" on typed seeds')
