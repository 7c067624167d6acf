"""``DistGraph``: a trainer's handle on the partitioned graph the servers hold.

Counts, the partition book and feature names come from the partition JSON;
``ndata``/``edata`` are ``DistTensor`` views of the features the servers
loaded; ``local_partition`` exposes this machine's CSC straight from shared
memory (read-only numpy views, no copy) for local sampling.

A heterogeneous graph answers DGL's typed questions: ``ntypes``,
``canonical_etypes``, ``num_nodes(ntype)``, and ``g.nodes[ntype].data[name]`` /
``g.edges[etype].data[name]``, DistTensors indexed by per-type ids.
"""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from distgnn.client.context import DistContext, get_context
from distgnn.client.sampling import RpcSampling, sampling_view
from distgnn.client.structure import machine_structure
from distgnn.client.tensor import DistTensor, as_ids, positions_by_owner
from distgnn.data.hetero import DEFAULT_ETYPE, DEFAULT_NTYPE, CanonicalEtype
from distgnn.errors import ConfigError
from distgnn.partition.book import RangePartitionBook, edge_policy, node_policy
from distgnn.partition.format import feature_policy, read_meta
from distgnn.rpc.client import RpcClient
from distgnn.sampling.source import LocalCSC, range_offset


@dataclass(frozen=True)
class LocalPartition:
    """This machine's partition in shared memory (read-only numpy arrays, see the format module).

    Attributes:
        part_id: partition (= machine) id.
        node_range, edge_range: global ``[start, end)`` ids owned here; owned node ``g`` has
            local id ``g - node_range[0]``.
        indptr: ``(num_owned + 1,)`` int64 CSC offsets of the owned nodes' in-edges.
        indices: local source id of each edge (int32 or int64; HALO nodes follow owned ones).
        eids: global edge id of each edge position.
        local2global: global id of each local node.
    """

    part_id: int
    node_range: tuple[int, int]
    edge_range: tuple[int, int]
    indptr: np.ndarray
    indices: np.ndarray
    eids: np.ndarray
    local2global: np.ndarray

    num_etypes: int = 1

    @property
    def num_owned_nodes(self) -> int:
        return self.node_range[1] - self.node_range[0]

    @functools.cached_property
    def eid_offset(self) -> int | None:
        """``eids[0]`` where the edge ids are a range in CSC order (:func:`distgnn.sampling.source.range_offset`),
        checked once."""
        return range_offset(self.eids)


@dataclass(frozen=True)
class TypedData:
    """``g.nodes[ntype]`` / ``g.edges[etype]``: ``data`` maps feature names to DistTensors of per-type ids."""

    data: dict[str, DistTensor]


class DistGraph:
    """The distributed graph ``graph_name``.

    Args:
        graph_name: must match the partition JSON's ``graph_name``.
        part_config: the partition JSON; defaults to the job's ``part_config``.
        context: defaults to ``distgnn.initialize``'s.
    """

    def __init__(
        self, graph_name: str, part_config: str | os.PathLike | None = None, context: DistContext | None = None
    ):
        self.context = context or get_context()
        part_config = part_config if part_config is not None else self.context.config.part_config
        if part_config is None:
            raise ConfigError("DistGraph needs part_config (argument or the launcher's DISTGNN_PART_CONFIG)")
        meta = read_meta(Path(part_config))
        if meta.graph_name != graph_name:
            raise ConfigError(f"{part_config} holds graph {meta.graph_name!r}, not {graph_name!r}")
        if meta.num_parts != self.context.config.num_machines:
            raise ConfigError(
                f"{part_config} has {meta.num_parts} partitions but the job has {self.context.config.num_machines} machines"
            )
        self.graph_name = graph_name
        self._meta = meta
        self._replicated: LocalCSC | None = None
        self._structure_lock = threading.Lock()
        self._book = meta.partition_book()
        shared = self.context.local_partition()
        self.local_partition = LocalPartition(
            shared.part_id, shared.node_range, shared.edge_range, **shared.graph, num_etypes=shared.num_etypes
        )
        self._node_data: dict[str, dict[str, DistTensor]] = {node_policy(t): {} for t in self._book.ntypes}
        self._edge_data: dict[str, dict[str, DistTensor]] = {edge_policy(e): {} for e in self._book.canonical_etypes}
        for kind, feats, tables in (
            ("node", meta.node_feats, self._node_data),
            ("edge", meta.edge_feats, self._edge_data),
        ):
            for key, spec in feats.items():
                policy, name = feature_policy(key, kind)
                tables[policy][name] = DistTensor.attach(
                    spec.shape, _torch_dtype(spec.dtype), name, policy, self.context
                )
        # The homogeneous graph's features by name (DGL's g.ndata / g.edata); empty on a heterogeneous graph.
        self.ndata: dict[str, DistTensor] = self._node_data.get("node", {})
        self.edata: dict[str, DistTensor] = self._edge_data.get("edge", {})

    @property
    def machine_id(self) -> int:
        return self.context.machine_id

    @property
    def rpc(self) -> RpcClient:
        return self.context.client

    @property
    def part_config(self) -> Path:
        """Path of the partition JSON this graph was opened from."""
        return self._meta.json_path

    @property
    def ntypes(self) -> list[str]:
        return self._book.ntypes

    @property
    def etypes(self) -> list[str]:
        return self._book.etypes

    @property
    def canonical_etypes(self) -> list[CanonicalEtype]:
        return self._book.canonical_etypes

    @property
    def is_homogeneous(self) -> bool:
        return self._book.is_homogeneous

    def num_nodes(self, ntype: str | None = None) -> int:
        """All nodes, or the nodes of type ``ntype``."""
        if ntype is None or (ntype == DEFAULT_NTYPE and self.is_homogeneous):
            return self._meta.num_nodes
        return int(self._book.nodes.type_counts[self._book.ntype_id(ntype)])

    def num_edges(self, etype: str | CanonicalEtype | None = None) -> int:
        """All edges, or the edges of type ``etype`` (canonical, ``"src:rel:dst"`` or a unique relation)."""
        if etype is None or (etype in (DEFAULT_ETYPE, DEFAULT_ETYPE[1]) and self.is_homogeneous):
            return self._meta.num_edges
        return int(self._book.edges.type_counts[self._book.etype_id(etype)])

    @property
    def nodes(self) -> dict[str, TypedData]:
        """``g.nodes[ntype].data[name]``: node features of one type, indexed by per-type ids."""
        return {t: TypedData(self._node_data[node_policy(t)]) for t in self.ntypes}

    @property
    def edges(self) -> _EdgeTypes:
        """``g.edges[etype].data[name]``: edge features of one type, indexed by per-type ids."""
        return _EdgeTypes(self)

    def sampling_view(self) -> tuple[LocalCSC, RpcSampling]:
        """This machine's CSC in shared memory and remote sampling through the RPC client (the sampler's view)."""
        return sampling_view(self)

    def replicated_structure(self) -> LocalCSC:
        """The whole graph's CSC, every partition's read from the partition folder and joined once per machine
        into the job's shared memory (:func:`distgnn.client.structure.machine_structure`: its size is checked
        against the host's memory), mapped read-only here."""
        with self._structure_lock:
            if self._replicated is None:
                self._replicated = machine_structure(
                    self.context.config.job_id, self.machine_id, self._meta, self.local_partition.num_etypes
                )
            return self._replicated

    def get_partition_book(self) -> RangePartitionBook:
        return self._book

    def in_degrees(self, ids: Any, etype: str | tuple[str, str, str] | None = None) -> torch.Tensor:
        """In-degree of each global node id (int64), local ones read from shared memory; with ``etype``, the
        in-edges of that edge type only."""
        ids = as_ids(ids, self.num_nodes(), "node")
        out = np.empty(len(ids), dtype=np.int64)
        client, local = self.rpc, self.local_partition
        k = local.num_etypes  # all edge types' rows of a node are consecutive
        t = None if etype is None else self.get_partition_book().etype_id(etype)
        pending = []
        for m, positions in positions_by_owner(self.context.range_ends("node"), ids).items():
            if m == self.machine_id:
                lids = ids[positions] - local.node_range[0]
                first, last = (lids * k, (lids + 1) * k) if t is None else (lids * k + t, lids * k + t + 1)
                out[positions] = local.indptr[last] - local.indptr[first]
            else:
                fields = {"etype": t}
                rid = client.send(m, "degrees", fields, [ids[positions]], server_id=self.context.read_server(m))
                pending.append((positions, rid))
        for (positions, _), reply in zip(pending, client.wait([rid for _, rid in pending]), strict=True):
            out[positions] = reply.arrays[0]
        return torch.from_numpy(out)

    def __repr__(self) -> str:
        return (
            f"DistGraph({self.graph_name!r}, num_nodes={self.num_nodes()}, num_edges={self.num_edges()}, "
            f"machine={self.machine_id}/{self.context.config.num_machines}, ndata={sorted(self.ndata)}, "
            f"edata={sorted(self.edata)})"
        )


class _EdgeTypes:
    """``g.edges[etype]`` for any spelling of an edge type."""

    def __init__(self, g: DistGraph):
        self._g = g

    def __getitem__(self, etype: str | CanonicalEtype) -> TypedData:
        canonical = self._g.get_partition_book().to_canonical_etype(etype)
        return TypedData(self._g._edge_data[edge_policy(canonical)])


def _torch_dtype(name: str) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=name)).dtype
