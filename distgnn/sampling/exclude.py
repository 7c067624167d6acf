"""Edge exclusion: remove given edge ids from sampled blocks, so a model never sees the edge it predicts."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from distgnn.sampling.block import Block


def drop_edges(block: Block, eids: torch.Tensor) -> Block:
    """``block`` without the edges whose global id is in ``eids``, in one vectorised pass.

    The source nodes stay as they are (a node whose only edge went keeps its row), so the
    blocks of the layers below still line up; a typed block keeps its kept edges' types.

    Args:
        block: a sampled block (on any device).
        eids: ``(X,)`` int64 global edge ids to remove (any order, repeats allowed).
    Returns:
        A new Block on the block's device (the block itself when it or ``eids`` is empty).
    """
    return _drop_sorted(block, torch.unique(eids.to(block.eids.device)))


def drop_edges_from_blocks(blocks: Sequence[Block], eids: torch.Tensor) -> list[Block]:
    """:func:`drop_edges` on every block of a mini-batch (``eids`` sorted once for all of them)."""
    if not blocks:
        return []
    excluded = torch.unique(eids.to(blocks[0].eids.device))
    return [_drop_sorted(block, excluded) for block in blocks]


def _drop_sorted(block: Block, excluded: torch.Tensor) -> Block:
    """:func:`drop_edges` with ``excluded`` sorted, unique and on the block's device."""
    if block.num_edges == 0 or len(excluded) == 0:
        return block
    if block.eids.device.type == "cpu":
        # A lookup table over the excluded ids' range: faster than a sort or a binary search
        # per edge (torch.isin, searchsorted) for a block's ~1e5 edges against ~1e3 excluded ids.
        keep = torch.from_numpy(~np.isin(block.eids.numpy(), excluded.numpy(), kind="table"))
    else:
        keep = ~torch.isin(block.eids, excluded)
    # New offsets: the kept edges before each old offset.
    kept_before = torch.zeros(block.num_edges + 1, dtype=torch.int64, device=keep.device)
    torch.cumsum(keep, 0, out=kept_before[1:])
    etypes = None if block.etypes is None else block.etypes[keep]
    return Block(
        block.src_nids,
        block.num_dst,
        kept_before[block.indptr],
        block.indices[keep],
        block.eids[keep],
        etypes,
        block.src_ntypes,
    )
