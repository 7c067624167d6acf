"""Model stacks over a list of Blocks (one per layer, input layer first)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from distgnn.nn.conv import GATConv, SAGEConv
from distgnn.nn.fused import Dropped, relu_dropout
from distgnn.sampling.block import Block


class LayerStack(nn.Module):
    """What the models share: ``self.layers`` and ``forward_layer(i, block, x)`` make ``forward``.

    ``forward(blocks, x)`` takes ``len(blocks) == num_layers`` Blocks, input layer
    first, and the input features ``(blocks[0].num_src, in_feats)``; returns
    ``(blocks[-1].num_dst, num_classes)``. ``forward_layer`` runs one layer, for
    layer-wise inference over all nodes; ``layer_dims[i]`` is its output width.
    """

    layers: nn.ModuleList
    layer_dims: list[int]

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def forward_layer(self, i: int, block: Block, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, blocks: Sequence[Block], x: torch.Tensor) -> torch.Tensor:
        if len(blocks) != self.num_layers:
            raise ValueError(f"got {len(blocks)} blocks for a {self.num_layers}-layer model")
        h = x
        for i, block in enumerate(blocks):
            h = self.forward_layer(i, block, h)
        return h


class GraphSAGE(LayerStack):
    """``num_layers`` SAGEConv layers with ReLU and dropout between them."""

    def __init__(self, in_feats: int, hidden: int, num_classes: int, num_layers: int = 2, dropout: float = 0.5):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        dims = [in_feats] + [hidden] * (num_layers - 1) + [num_classes]
        self.layers = nn.ModuleList(SAGEConv(a, b) for a, b in zip(dims[:-1], dims[1:], strict=True))
        self.dropout = nn.Dropout(dropout)
        self.layer_dims = dims[1:]

    def forward_layer(self, i: int, block: Block, x: torch.Tensor) -> torch.Tensor:
        h = self.layers[i](block, x)
        if i != self.num_layers - 1:
            h = relu_dropout(h, self.dropout.p, self.training)
        return h

    def forward(self, blocks: Sequence[Block], x: torch.Tensor) -> torch.Tensor:
        if len(blocks) != self.num_layers:
            raise ValueError(f"got {len(blocks)} blocks for a {self.num_layers}-layer model")
        h = x
        for i, block in enumerate(blocks):
            h = self.layers[i](block, h)
            if i != self.num_layers - 1:  # the next layer applies ReLU + dropout, fused with its mean where it can
                h = Dropped(h, self.dropout.p, self.training)
        return h


class GAT(LayerStack):
    """``num_layers`` GATConv layers; hidden layers concatenate heads (ELU), the output layer averages them."""

    def __init__(
        self,
        in_feats: int,
        hidden: int,
        num_classes: int,
        num_layers: int = 2,
        num_heads: int = 4,
        dropout: float = 0.5,
    ):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        self.layers = nn.ModuleList()
        dim = in_feats
        for i in range(num_layers):
            last = i == num_layers - 1
            heads = 1 if last else num_heads
            out = num_classes if last else hidden
            self.layers.append(GATConv(dim, out, heads, feat_drop=dropout if i else 0.0))
            dim = out * heads
        self.layer_dims = [layer.out_feats * layer.num_heads for layer in self.layers[:-1]] + [num_classes]

    def forward_layer(self, i: int, block: Block, x: torch.Tensor) -> torch.Tensor:
        h = self.layers[i](block, x)
        if i != self.num_layers - 1:
            return F.elu(h.flatten(1))
        return h.mean(1)


class MLP(LayerStack):
    """A baseline that ignores the graph: each node's own features through ``num_layers`` linear layers.

    Takes the same Blocks as the GNNs (destination nodes come first among the
    sources, so a node's own row is always at hand) and uses only their
    ``num_dst`` counts.
    """

    def __init__(self, in_feats: int, hidden: int, num_classes: int, num_layers: int = 2, dropout: float = 0.5):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        dims = [in_feats] + [hidden] * (num_layers - 1) + [num_classes]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:], strict=True))
        self.dropout = nn.Dropout(dropout)
        self.layer_dims = dims[1:]

    def forward_layer(self, i: int, block: Block, x: torch.Tensor) -> torch.Tensor:
        h = self.layers[i](x[: block.num_dst])
        if i != self.num_layers - 1:
            h = relu_dropout(h, self.dropout.p, self.training)
        return h
