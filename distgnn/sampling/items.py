"""A layer's sampling items: each frontier node with each edge type that ends at its type and has a fanout.

On a heterogeneous graph one layer samples (node, edge type) *items*, each one row of the partition's typed
CSC (docs/partition-format.md), so the kernel samples every edge type of a layer in one call and a remote
machine gets one request for all its items. A homogeneous graph is the case of one edge type: its items are
the frontier nodes themselves (:class:`LayerItems` with ``pos`` and ``etype`` None), so both run one path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

from distgnn.errors import ConfigError, InputError
from distgnn.partition.book import RangePartitionBook
from distgnn.sampling.block import Block

Frontier = TypeVar("Frontier", np.ndarray, torch.Tensor)


@dataclass(frozen=True)
class LayerItems:
    """One layer's items over a frontier of ``n`` nodes.

    Attributes:
        fanout: the fanout of the one edge type (an int), or one per edge type (a list) when typed.
        pos: ``(I,)`` int64 position in the frontier of each item's node, grouped by node in frontier order;
            None when the items are the frontier nodes themselves (one edge type).
        etype: ``(I,)`` int64 edge type of each item; None with one edge type.
    """

    fanout: int | list[int]
    pos: np.ndarray | None = None
    etype: np.ndarray | None = None


def layer_items(book: RangePartitionBook, fanout: int | dict, frontier: np.ndarray | torch.Tensor) -> LayerItems:
    """The items of one layer with ``fanout`` (an int or ``{etype: k}``) over ``frontier`` (global ids; read,
    on the host, only on a typed graph)."""
    fanouts = layer_fanouts(book, fanout)
    if book.is_homogeneous:
        return LayerItems(fanouts)
    if isinstance(frontier, torch.Tensor):
        frontier = frontier.cpu().numpy()
    return LayerItems(fanouts, *typed_items(book, frontier, fanouts))


def check_layer_fanout(fanout: int | Mapping) -> int | dict:
    if isinstance(fanout, Mapping):
        checked = {}
        for etype, k in fanout.items():
            if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < -1:
                raise ConfigError(
                    f"fanouts: the fanout of edge type {etype!r} must be an int >= -1 (0 skips it), got {k!r}"
                )
            checked[etype] = int(k)
        if not any(checked.values()):
            raise ConfigError(f"fanouts: the layer {fanout} samples no edge type")
        return checked
    if isinstance(fanout, bool) or not isinstance(fanout, (int, np.integer)) or fanout < -1 or fanout == 0:
        raise ConfigError(
            f"fanouts: a layer's fanout must be a positive int, -1 for all, or a dict per edge type; got {fanout!r}"
        )
    return int(fanout)


def layer_fanouts(book: RangePartitionBook, fanout: int | dict) -> int | list[int]:
    """One layer's fanout for ``book``'s graph: an int on a homogeneous graph, else one per edge type."""
    if book.is_homogeneous:
        if isinstance(fanout, dict):
            (k,) = layer_fanouts_typed(book, fanout)
            return k
        return fanout
    if isinstance(fanout, dict):
        return layer_fanouts_typed(book, fanout)
    return [fanout] * len(book.canonical_etypes)


def layer_fanouts_typed(book: RangePartitionBook, fanout: dict) -> list[int]:
    out = [0] * len(book.canonical_etypes)
    for etype, k in fanout.items():
        try:
            out[book.etype_id(etype)] = k
        except InputError as exc:
            raise ConfigError(f"fanouts: {exc}") from None
    return out


def typed_items(book: RangePartitionBook, seeds: np.ndarray, fanouts: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The (node, edge type) items of a typed layer, grouped by seed in seed order.

    Returns ``(item_pos, item_etype)``: per item the position of its node in ``seeds`` and the edge type,
    for every edge type that ends at the node's type and has a non-zero fanout.
    """
    ntypes, _ = book.map_to_per_ntype(seeds)
    wanted = (ntypes[:, None] == book.etype_dst[None, :]) & (np.asarray(fanouts)[None, :] != 0)
    item_pos, item_etype = np.nonzero(wanted)
    return item_pos.astype(np.int64), item_etype.astype(np.int64)


def sample_layers(
    layer: Callable[[Frontier, int | dict, Sequence[int]], tuple[Block, Frontier]],
    frontier: Frontier,
    layers: Sequence[tuple[int | dict, Sequence[int]]],
) -> tuple[list[Block], Frontier]:
    """Layers one at a time: ``layer(frontier, fanout, part_seeds)`` for each ``(fanout, part_seeds)`` of
    ``layers`` (output layer first), each over the previous one's next frontier. Returns the Blocks in that order
    and the last frontier."""
    blocks = []
    for fanout, part_seeds in layers:
        block, frontier = layer(frontier, fanout, part_seeds)
        blocks.append(block)
    return blocks, frontier
