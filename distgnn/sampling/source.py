"""What the sampler reads: a partition's CSC (:class:`LocalCSC`), remote machines (:class:`RemoteSampling`), and
the graph that hands out both (:class:`GraphSource`: a :class:`distgnn.DistGraph` in a job, or
:class:`InProcessGraph`, a whole graph in this process, for single-process training and tests, so both run the
same code).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from distgnn.data.graph import Graph
from distgnn.data.hetero import DEFAULT_NTYPE, HeteroGraph, materialize
from distgnn.errors import InputError
from distgnn.partition.book import RangePartitionBook


def range_offset(ids: np.ndarray) -> int | None:
    """``ids[0]`` where ``ids`` is the range ``ids[0], ids[0] + 1, ...`` (a reshuffled partition numbers its edges
    in CSC order), else None. A pass over ``ids``: callers keep the answer with the array."""
    if len(ids) == 0 or ids[-1] - ids[0] != len(ids) - 1:
        return None
    return int(ids[0]) if bool((np.diff(ids) == 1).all()) else None


@dataclass(frozen=True)
class LocalCSC:
    """The partition this process can read directly.

    Attributes:
        part_id: its partition id (= machine id).
        node_start: global id of local node 0 (owned nodes are a contiguous range).
        indptr, indices: CSC of the in-edges of the owned nodes (local ids); with ``num_etypes`` R > 1
            row ``v * R + t`` holds owned node ``v``'s in-edges of edge type ``t`` (see docs/partition-format.md).
        eids: global edge id of each CSC position (may be empty where ``eid_offset`` gives them: the replicated
            structure holds no range).
        local2global: global id of each local node.
        edge_weights: optional edge arrays by name, one value per CSC position.
        num_etypes: R, the number of edge types.
        eid_offset: where ``eids`` is the range ``eid_offset, eid_offset + 1, ...`` (:func:`range_offset`), so a
            position's edge id is the position plus it and sampling gathers no edge ids; None otherwise.
        replicated: the CSC holds every machine's nodes (the whole graph's structure,
            :func:`distgnn.client.structure.replicated_csc`; ``node_start`` 0, ``indices`` global ids): every seed
            is sampled here, none is sent to another machine.
    """

    part_id: int
    node_start: int
    indptr: np.ndarray
    indices: np.ndarray
    eids: np.ndarray
    local2global: np.ndarray
    edge_weights: dict[str, np.ndarray]
    num_etypes: int = 1
    eid_offset: int | None = None
    replicated: bool = False

    def rows(self, seeds: np.ndarray, etypes: np.ndarray | None = None) -> np.ndarray:
        """CSC rows of owned global ``seeds`` (of one edge type each, ``etypes``, on a typed CSC)."""
        local = seeds - self.node_start
        if etypes is None:
            return local
        return local * self.num_etypes + etypes


@dataclass(frozen=True)
class SampleRequest:
    """One machine's share of a sampling layer: pick up to ``fanout`` in-neighbours of each of its ``seeds``.

    Attributes:
        seeds: ``(B,)`` int64 global ids owned by the machine that samples them (repeats allowed).
        fanout: picks per seed (``-1``: all); with ``etypes``, a list of one fanout per edge type.
        replace: draw with replacement.
        prob: name of the edge array to sample by (weights), or None for uniform picks.
        rng_seed: seed of the machine's random streams (seed ``i`` draws from ``(rng_seed, i)`` alone).
        etypes: ``(B,)`` int64 edge type of each seed (typed items: a node may repeat, once per edge type),
            or None.
    """

    seeds: np.ndarray
    fanout: int | list[int]
    replace: bool
    prob: str | None
    rng_seed: int
    etypes: np.ndarray | None = None


class RemoteSampling(Protocol):
    """Sends ``sample`` requests to the servers of other machines and collects the replies."""

    def send_sample(self, machine_id: int, request: SampleRequest) -> object:
        """Send ``request`` to ``machine_id``, which owns its seeds; a handle for :meth:`wait_sample`."""
        ...

    def wait_sample(self, handles: Sequence[object]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """``(counts, neighbour global ids, global edge ids)`` per handle, in order."""
        ...

    def find_edges(self, eids_by_machine: dict[int, np.ndarray]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """``(source, destination)`` global node ids of each machine's own edges (one request per machine)."""
        ...


class GraphSource(Protocol):
    """What the sampler needs from a graph: its partition book, and its local CSC with the remote machines."""

    def get_partition_book(self) -> RangePartitionBook: ...

    def sampling_view(self) -> tuple[LocalCSC, RemoteSampling | None]: ...

    def replicated_structure(self) -> LocalCSC:
        """The whole graph's CSC (``replicated=True``), for a sampler that samples every layer here."""
        ...


def as_node_ids(ids: torch.Tensor | np.ndarray, name: str = "seeds") -> np.ndarray:
    """``ids`` (a tensor on any device or an array) as a contiguous 1-D int64 numpy array."""
    if isinstance(ids, torch.Tensor):
        ids = ids.detach().cpu().numpy()
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    if ids.ndim != 1:
        raise InputError(f"{name} must be a 1-D array of node ids, got shape {ids.shape}")
    return ids


class InProcessGraph:
    """A whole :class:`~distgnn.data.graph.Graph` held in this process, one partition.

    Behaves like a DistGraph for the sampler, the loader and the training
    script (``ndata`` maps names to torch tensors indexed by global id), so a
    single-process run goes through exactly the distributed code path. Node
    and edge ids are the Graph's own. A :class:`~distgnn.data.hetero.HeteroGraph`
    gives the typed view (``ntypes``, ``g.nodes[T].data``...) with homogeneous ids
    numbering the types one after the other.
    """

    def __init__(self, graph: Graph | HeteroGraph):
        if isinstance(graph, HeteroGraph) and not graph.is_homogeneous:
            self._init_typed(graph.validate())
            return
        if isinstance(graph, HeteroGraph):
            graph = _as_graph(graph)
        self.nodes = self.edges = None
        graph.validate()
        order = np.argsort(graph.dst, kind="stable")
        indptr = np.zeros(graph.num_nodes + 1, dtype=np.int64)
        np.cumsum(np.bincount(graph.dst, minlength=graph.num_nodes), out=indptr[1:])
        self.graph_name = graph.name
        self._num_nodes = graph.num_nodes
        self._num_edges = graph.num_edges
        self.num_classes = graph.num_classes
        self.ndata = {name: torch.from_numpy(np.ascontiguousarray(arr)) for name, arr in graph.ndata.items()}
        self.edata = {name: torch.from_numpy(np.ascontiguousarray(arr)) for name, arr in graph.edata.items()}
        self._book = RangePartitionBook([[0, graph.num_nodes]], [[0, graph.num_edges]])
        self._local = LocalCSC(
            part_id=0,
            node_start=0,
            indptr=indptr,
            indices=np.ascontiguousarray(graph.src[order], dtype=np.int64),
            eids=order.astype(np.int64),
            local2global=np.arange(graph.num_nodes, dtype=np.int64),
            edge_weights={
                name: np.ascontiguousarray(arr[order], dtype=np.float32)
                for name, arr in graph.edata.items()
                if arr.ndim == 1 and arr.dtype.kind == "f"
            },
        )

    def _init_typed(self, graph: HeteroGraph) -> None:
        ntypes, etypes = graph.ntypes, graph.canonical_etypes
        counts = np.array([graph.num_nodes[t] for t in ntypes], dtype=np.int64)
        node_ends = np.cumsum(counts)
        offsets = dict(zip(ntypes, (node_ends - counts).tolist(), strict=True))
        edge_counts = np.array([graph.num_edges(e) for e in etypes], dtype=np.int64)
        edge_ends = np.cumsum(edge_counts)
        n, m, k = int(node_ends[-1]), int(edge_ends[-1]), len(etypes)
        src = np.concatenate([graph.edges[e][0] + offsets[e[0]] for e in etypes]).astype(np.int64)
        dst = np.concatenate([graph.edges[e][1] + offsets[e[2]] for e in etypes]).astype(np.int64)
        rows = dst * k + np.repeat(np.arange(k, dtype=np.int64), edge_counts)
        order = np.argsort(rows, kind="stable")
        indptr = np.zeros(n * k + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=n * k), out=indptr[1:])
        self.graph_name = graph.name
        self._num_nodes, self._num_edges = n, m
        self.num_classes = graph.num_classes
        self._book = RangePartitionBook(
            [[0, n]],
            [[0, m]],
            ntypes,
            etypes,
            np.stack([node_ends - counts, node_ends], axis=1)[None],
            np.stack([edge_ends - edge_counts, edge_ends], axis=1)[None],
        )
        self.ndata, self.edata = {}, {}
        self.nodes = {
            t: TypedTensors({k_: torch.from_numpy(np.ascontiguousarray(materialize(a))) for k_, a in arrays.items()})
            for t, arrays in ((t, graph.ndata.get(t, {})) for t in ntypes)
        }
        self._edge_data = {
            e: TypedTensors({k_: torch.from_numpy(np.ascontiguousarray(materialize(a))) for k_, a in arrays.items()})
            for e, arrays in ((e, graph.edata.get(e, {})) for e in etypes)
        }
        self.edges = _InProcessEdgeTypes(self)
        self._local = LocalCSC(0, 0, indptr, src[order], order.astype(np.int64), np.arange(n), {}, num_etypes=k)

    @property
    def ntypes(self) -> list[str]:
        return self._book.ntypes

    @property
    def canonical_etypes(self) -> list[tuple[str, str, str]]:
        return self._book.canonical_etypes

    @property
    def is_homogeneous(self) -> bool:
        return self._book.is_homogeneous

    def num_nodes(self, ntype: str | None = None) -> int:
        if ntype is None or self._book.is_homogeneous:
            return self._num_nodes
        return int(self._book.nodes.type_counts[self._book.ntype_id(ntype)])

    def num_edges(self, etype=None) -> int:
        if etype is None or self._book.is_homogeneous:
            return self._num_edges
        return int(self._book.edges.type_counts[self._book.etype_id(etype)])

    def get_partition_book(self) -> RangePartitionBook:
        return self._book

    def sampling_view(self) -> tuple[LocalCSC, RemoteSampling | None]:
        return self._local, None

    def replicated_structure(self) -> LocalCSC:
        """The whole graph is already here: its CSC, marked replicated."""
        return dataclasses.replace(self._local, replicated=True)


@dataclass(frozen=True)
class TypedTensors:
    """``g.nodes[ntype]`` / ``g.edges[etype]`` of an in-process graph: ``data`` maps names to tensors."""

    data: dict[str, torch.Tensor]


class _InProcessEdgeTypes:
    def __init__(self, g: InProcessGraph):
        self._g = g

    def __getitem__(self, etype) -> TypedTensors:
        return self._g._edge_data[self._g.get_partition_book().to_canonical_etype(etype)]


def _as_graph(graph: HeteroGraph) -> Graph:
    """The one-type HeteroGraph as a Graph."""
    ((src, dst),) = graph.edges.values()
    ndata = {k: materialize(a) for k, a in graph.ndata.get(DEFAULT_NTYPE, {}).items()}
    edata = {k: materialize(a) for k, a in next(iter(graph.edata.values()), {}).items()}
    return Graph(graph.name, graph.total_nodes, src, dst, ndata, edata, graph.num_classes)


def split_by_type(book: RangePartitionBook, nids: torch.Tensor) -> dict[str, torch.Tensor]:
    """``{ntype: per-type ids}`` of homogeneous ``nids``, each type's ids in their order in ``nids``
    (types without nodes included, empty), on ``nids``' device."""
    types, per_type = book.map_to_per_ntype(nids.cpu())
    return {t: per_type[types == i].to(nids.device) for i, t in enumerate(book.ntypes)}
