"""Edge exclusion: remove given edge ids from sampled blocks, so a model never sees the edge it predicts."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from distgnn.sampling.block import Block


def drop_edges(block: Block, eids: torch.Tensor) -> Block:
    """``block`` without the edges whose global id is in ``eids``, in one vectorised pass.

    The source nodes stay as they are (a node whose only edge went keeps its row), so the
    blocks of the layers below still line up.

    Args:
        block: a sampled block (on any device).
        eids: ``(X,)`` int64 global edge ids to remove (any order, repeats allowed).
    Returns:
        A new Block on the block's device (the block itself when it or ``eids`` is empty).
    """
    if block.num_edges == 0 or len(eids) == 0:
        return block
    keep = ~torch.isin(block.eids, eids.to(block.eids.device))
    kept_dst = block.dst_index()[keep]
    counts = torch.bincount(kept_dst, minlength=block.num_dst)
    indptr = torch.zeros(block.num_dst + 1, dtype=torch.int64, device=block.indptr.device)
    torch.cumsum(counts, 0, out=indptr[1:])
    return Block(block.src_nids, block.num_dst, indptr, block.indices[keep], block.eids[keep])


def drop_edges_from_blocks(blocks: Sequence[Block], eids: torch.Tensor) -> list[Block]:
    """:func:`drop_edges` on every block of a mini-batch."""
    return [drop_edges(block, eids) for block in blocks]
