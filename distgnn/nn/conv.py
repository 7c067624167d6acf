"""Graph convolutions on Blocks: GraphSAGE (mean) and GAT, in plain torch.

Both take a Block and the source nodes' features ``x`` of shape
``(block.num_src, in_feats)``; the destination nodes are the first
``block.num_dst`` rows of ``x`` (Blocks order destinations first).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import distgnn.nn.aggregate as aggregate
from distgnn.nn.fused import Dropped
from distgnn.nn.matmul import linear
from distgnn.sampling.block import Block, SelfAndMean


class SAGEConv(nn.Module):
    """GraphSAGE with mean aggregation: ``W_self x_d + W_neigh mean_{s->d} x_s + b``.

    Returns ``(num_dst, out_feats)``. Where ``out_feats < in_feats`` the
    neighbour projection runs before aggregation (the mean is linear), which
    moves fewer bytes through the sparse product.
    """

    def __init__(self, in_feats: int, out_feats: int, bias: bool = True):
        super().__init__()
        self.in_feats = in_feats
        self.out_feats = out_feats
        self.fc_self = nn.Linear(in_feats, out_feats, bias=False)
        self.fc_neigh = nn.Linear(in_feats, out_feats, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_feats)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        gain = nn.init.calculate_gain("relu")
        nn.init.xavier_uniform_(self.fc_self.weight, gain=gain)
        nn.init.xavier_uniform_(self.fc_neigh.weight, gain=gain)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, block: Block, x: torch.Tensor | SelfAndMean | Dropped) -> torch.Tensor:
        """``x``: ``(block.num_src, in_feats)``, the block's ``[x_dst | mean]`` aggregated already
        (:class:`~distgnn.sampling.block.SelfAndMean`, a first layer over fixed features), or the previous layer's
        output with its ReLU + dropout still to apply (:class:`~distgnn.nn.fused.Dropped`)."""
        if isinstance(x, SelfAndMean):
            if x.rows.shape != (block.num_dst, 2 * self.in_feats):
                raise ValueError(
                    f"SelfAndMean rows must be ({block.num_dst}, {2 * self.in_feats}), got {tuple(x.rows.shape)}"
                )
            return self._combine(x.rows)
        if isinstance(x, Dropped):  # the previous layer's ReLU + dropout, applied here
            if self.out_feats >= self.in_feats:
                return self._combine(aggregate.relu_dropout_self_and_mean(block, x.rows, x.p, x.training))
            x = x.apply()
        if self.out_feats < self.in_feats:
            out = aggregate.mean(block, linear(x, self.fc_neigh.weight))
            if self.bias is not None:
                out = out + self.bias
            return linear(x[: block.num_dst], self.fc_self.weight, out)
        # One product of [x_dst | mean] with [W_self | W_neigh]: the aggregation writes both halves in
        # one pass, and the gradient of x comes back in one tensor (no zero-padded slice gradient to add).
        return self._combine(aggregate.self_and_mean(block, x))

    def _combine(self, inputs: torch.Tensor) -> torch.Tensor:
        """``[x_dst | mean] @ [W_self | W_neigh]^T + b``."""
        weight = torch.cat([self.fc_self.weight, self.fc_neigh.weight], dim=1)
        return linear(inputs, weight, self.bias)


class GATConv(nn.Module):
    """Graph attention (Velickovic et al.) with ``num_heads`` heads.

    ``alpha_{s->d} = softmax_s(leaky_relu(a_l . W x_s + a_r . W x_d))`` over the
    in-edges of ``d``; output ``sum_s alpha_{s->d} W x_s`` per head, shape
    ``(num_dst, num_heads, out_feats)``. A destination without in-edges gets
    zeros (plus the bias and residual, where set).
    """

    def __init__(
        self,
        in_feats: int,
        out_feats: int,
        num_heads: int = 1,
        feat_drop: float = 0.0,
        attn_drop: float = 0.0,
        negative_slope: float = 0.2,
        residual: bool = False,
        bias: bool = True,
    ):
        super().__init__()
        self.num_heads = num_heads
        self.out_feats = out_feats
        self.fc = nn.Linear(in_feats, out_feats * num_heads, bias=False)
        self.attn_l = nn.Parameter(torch.empty(1, num_heads, out_feats))
        self.attn_r = nn.Parameter(torch.empty(1, num_heads, out_feats))
        self.feat_drop = nn.Dropout(feat_drop)
        self.attn_drop = nn.Dropout(attn_drop)
        self.negative_slope = negative_slope
        self.res_fc = nn.Linear(in_feats, out_feats * num_heads, bias=False) if residual else None
        self.bias = nn.Parameter(torch.zeros(num_heads, out_feats)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        gain = nn.init.calculate_gain("relu")
        nn.init.xavier_normal_(self.fc.weight, gain=gain)
        nn.init.xavier_normal_(self.attn_l, gain=gain)
        nn.init.xavier_normal_(self.attn_r, gain=gain)
        if self.res_fc is not None:
            nn.init.xavier_normal_(self.res_fc.weight, gain=gain)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, block: Block, x: torch.Tensor) -> torch.Tensor:
        x = self.feat_drop(x)
        z = self.fc(x).view(-1, self.num_heads, self.out_feats)
        z_dst = z[: block.num_dst]
        el = (z * self.attn_l).sum(-1)
        er = (z_dst * self.attn_r).sum(-1)
        src, dst = block.indices, block.dst_index()
        scores = F.leaky_relu(el[src] + er[dst], self.negative_slope)
        # One dst index serves the softmax and every head's sum.
        alpha = self.attn_drop(aggregate.edge_softmax(block, scores, dst))
        out = torch.stack(
            [aggregate.weighted_sum(block, z[:, h], alpha[:, h], dst) for h in range(self.num_heads)], dim=1
        )
        if self.res_fc is not None:
            out = out + self.res_fc(x[: block.num_dst]).view(-1, self.num_heads, self.out_feats)
        if self.bias is not None:
            out = out + self.bias
        return out
