"""Random Blocks shaped like a neighbour sampler's, for the training-step tests (tests/train/test_step*.py)."""

from __future__ import annotations

import torch

from distgnn.sampling.block import Block


def random_blocks(num_seeds: int, fanouts: list[int], gen: torch.Generator, device: str = "cpu") -> list[Block]:
    """Blocks shaped like a sampler's (input layer first): at most ``f`` in-edges per destination, destinations
    first among the sources, each layer's destinations are the sources of the layer above it."""
    blocks, dst = [], num_seeds
    for fanout in reversed(fanouts):
        degrees = torch.randint(0, fanout + 1, (dst,), generator=gen)
        indptr = torch.zeros(dst + 1, dtype=torch.int64)
        torch.cumsum(degrees, 0, out=indptr[1:])
        edges = int(indptr[-1])
        num_src = dst + int(torch.randint(0, edges + 1, (1,), generator=gen))
        indices = torch.randint(0, num_src, (edges,), generator=gen)
        block = Block(torch.arange(num_src), dst, indptr, indices, torch.arange(edges))
        blocks.append(block.to(device))
        dst = num_src
    return blocks[::-1]
