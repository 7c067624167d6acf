"""Convert distgnn Blocks for other GNN libraries (each imported only when asked for)."""

from __future__ import annotations

import torch

from distgnn.sampling.block import Block


def to_dgl_block(block: Block):
    """A DGL block (``dgl.create_block``) with the same edges, in the same order.

    Source and destination node ``i`` of the DGL block are ``block.src_nids[i]``
    and ``block.dst_nids[i]``; their global ids are stored as ``srcdata[dgl.NID]``
    and ``dstdata[dgl.NID]``, the edges' global ids as ``edata[dgl.EID]``.
    Requires dgl.
    """
    import dgl

    src = block.indices
    dst = block.dst_index()
    out = dgl.create_block((src, dst), num_src_nodes=block.num_src, num_dst_nodes=block.num_dst, idtype=torch.int64)
    out = out.to(block.src_nids.device)
    out.srcdata[dgl.NID] = block.src_nids
    out.dstdata[dgl.NID] = block.dst_nids
    out.edata[dgl.EID] = block.eids
    return out


def to_pyg(block: Block) -> tuple[torch.Tensor, tuple[int, int]]:
    """PyG bipartite form: ``(edge_index, (num_src, num_dst))``.

    ``edge_index`` is ``(2, num_edges)`` int64 with row 0 the source position
    (into ``block.src_nids``) and row 1 the destination position, so
    ``conv((x, x[:num_dst]), edge_index, size=...)`` works with PyG layers that
    take bipartite inputs. Needs no PyG import itself.
    """
    return block.edge_index(), (block.num_src, block.num_dst)
