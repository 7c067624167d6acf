"""``DistGraph``: a trainer's handle on the partitioned graph the servers hold.

Counts, the partition book and feature names come from the partition JSON;
``ndata``/``edata`` are ``DistTensor`` views of the features the servers
loaded; ``local_partition`` exposes this machine's CSC straight from shared
memory (read-only numpy views, no copy) for local sampling.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from distgnn.context import DistContext, get_context
from distgnn.errors import ConfigError
from distgnn.partition.format import read_meta
from distgnn.partition_book import RangePartitionBook
from distgnn.rpc.client import RpcClient
from distgnn.tensor import DistTensor, as_ids, positions_by_owner


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

    @property
    def num_owned_nodes(self) -> int:
        return self.node_range[1] - self.node_range[0]


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
        self._book = meta.partition_book()
        shared = self.context.local_partition()
        self.local_partition = LocalPartition(shared.part_id, shared.node_range, shared.edge_range, **shared.graph)
        self.ndata: dict[str, DistTensor] = {
            name: DistTensor.attach(spec.shape, _torch_dtype(spec.dtype), name, "node", self.context)
            for name, spec in meta.node_feats.items()
        }
        self.edata: dict[str, DistTensor] = {
            name: DistTensor.attach(spec.shape, _torch_dtype(spec.dtype), name, "edge", self.context)
            for name, spec in meta.edge_feats.items()
        }

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

    def num_nodes(self) -> int:
        return self._meta.num_nodes

    def num_edges(self) -> int:
        return self._meta.num_edges

    def get_partition_book(self) -> RangePartitionBook:
        return self._book

    def in_degrees(self, ids: Any) -> torch.Tensor:
        """In-degree of each global node id (int64), local ones read from shared memory."""
        ids = as_ids(ids, self.num_nodes(), "node")
        out = np.empty(len(ids), dtype=np.int64)
        client, local = self.rpc, self.local_partition
        pending = []
        for m, positions in positions_by_owner(self.context.range_ends("node"), ids).items():
            if m == self.machine_id:
                lids = ids[positions] - local.node_range[0]
                out[positions] = local.indptr[lids + 1] - local.indptr[lids]
            else:
                rid = client.send(m, "degrees", arrays=[ids[positions]], server_id=self.context.read_server(m))
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


def _torch_dtype(name: str) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=name)).dtype
