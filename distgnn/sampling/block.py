"""Blocks: the message-flow graph of one GNN layer in a sampled mini-batch."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import torch


@dataclass
class Block:
    """One layer's bipartite graph from source to destination nodes, in CSC.

    Destination nodes come first among the source nodes, so
    ``src_nids[:num_dst]`` are the destination nodes' global ids.

    Attributes:
        src_nids: ``(num_src,)`` int64 global ids of the source nodes.
        num_dst: number of destination nodes.
        indptr: ``(num_dst + 1,)`` int64; the in-edges of destination ``i`` are
            ``indptr[i]:indptr[i+1]``.
        indices: ``(num_edges,)`` int64 positions into ``src_nids``.
        eids: ``(num_edges,)`` int64 global (new) edge ids.
        etypes: on a heterogeneous graph, ``(num_edges,)`` int64 edge type id of each edge (the graph's
            ``canonical_etypes`` order), else None.
        src_ntypes: on a heterogeneous graph, ``(num_src,)`` int64 node type id of each source node
            (destinations first, so ``src_ntypes[:num_dst]`` types the destinations), else None.
    """

    src_nids: torch.Tensor
    num_dst: int
    indptr: torch.Tensor
    indices: torch.Tensor
    eids: torch.Tensor
    etypes: torch.Tensor | None = None
    src_ntypes: torch.Tensor | None = None

    @property
    def dst_nids(self) -> torch.Tensor:
        return self.src_nids[: self.num_dst]

    @property
    def num_src(self) -> int:
        return int(self.src_nids.shape[0])

    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Block:
        return Block(
            self.src_nids.to(device, non_blocking=non_blocking),
            self.num_dst,
            self.indptr.to(device, non_blocking=non_blocking),
            self.indices.to(device, non_blocking=non_blocking),
            self.eids.to(device, non_blocking=non_blocking),
            None if self.etypes is None else self.etypes.to(device, non_blocking=non_blocking),
            None if self.src_ntypes is None else self.src_ntypes.to(device, non_blocking=non_blocking),
        )

    def tensors(self) -> Iterator[torch.Tensor]:
        """Every tensor the block holds."""
        yield from (self.src_nids, self.indptr, self.indices, self.eids)
        yield from (t for t in (self.etypes, self.src_ntypes) if t is not None)

    def dst_index(self) -> torch.Tensor:
        """``(num_edges,)`` int64 destination position of each edge (COO from CSC)."""
        counts = self.indptr[1:] - self.indptr[:-1]
        return torch.repeat_interleave(torch.arange(self.num_dst, device=self.indptr.device), counts)

    def edge_index(self) -> torch.Tensor:
        """PyG-style ``(2, num_edges)`` int64 ``[src_pos, dst_pos]``."""
        return torch.stack([self.indices, self.dst_index()])


class SelfAndMean(NamedTuple):
    """A first layer's input aggregated before it reached the trainer: ``rows`` ``(num_dst, 2F)`` is what
    :func:`distgnn.nn.aggregate.self_and_mean` of the block and the raw features would give (summed where the rows
    lie, :meth:`distgnn.client.tensor.DistTensor.read_self_and_mean`, or by the features' owners,
    :meth:`distgnn.client.tensor.DistTensor.self_and_mean`). Fixed input features need no gradient, so the
    layer only multiplies it; a model passes it to its first layer in place of ``x``."""

    rows: torch.Tensor
