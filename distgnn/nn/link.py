"""Link prediction heads: scorers of node-embedding pairs and the losses that train them."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from distgnn.errors import InputError


class DotPredictor(nn.Module):
    """Score of a pair = the dot product of its endpoints' embeddings.

    ``forward(h_src, h_dst)``: ``(..., d)`` float rows (leading dims broadcast) -> ``(...)`` scores (logits).
    """

    def forward(self, h_src: torch.Tensor, h_dst: torch.Tensor) -> torch.Tensor:
        return (h_src * h_dst).sum(-1)


class MLPPredictor(nn.Module):
    """Score of a pair = an MLP of the element-wise product of its endpoints' embeddings.

    Args:
        in_feats: embedding width d.
        hidden: hidden width; ``num_layers`` linear layers in all (ReLU between them), the last to one score.
    ``forward(h_src, h_dst)``: ``(..., d)`` -> ``(...)`` logits.
    """

    def __init__(self, in_feats: int, hidden: int = 256, num_layers: int = 2):
        super().__init__()
        if num_layers < 1:
            raise InputError(f"an MLP predictor needs num_layers >= 1, got {num_layers}")
        dims = [in_feats] + [hidden] * (num_layers - 1) + [1]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:], strict=True))

    def forward(self, h_src: torch.Tensor, h_dst: torch.Tensor) -> torch.Tensor:
        h = h_src * h_dst
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i < len(self.layers) - 1:
                h = F.relu(h)
        return h.squeeze(-1)


def score_pairs(predictor: nn.Module, h: torch.Tensor, pairs) -> torch.Tensor:
    """``(P,)`` scores of a :class:`~distgnn.edge_dataloader.PairGraph`'s pairs from ``h``, the
    ``(num_output_nodes, d)`` embeddings of its output nodes."""
    return predictor(h[pairs.src], h[pairs.dst])


def bce_loss(pos_score: torch.Tensor, neg_score: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy of logits: positives labelled 1, negatives 0, averaged over all pairs."""
    scores = torch.cat([pos_score.reshape(-1), neg_score.reshape(-1)])
    labels = torch.cat([torch.ones_like(pos_score.reshape(-1)), torch.zeros_like(neg_score.reshape(-1))])
    return F.binary_cross_entropy_with_logits(scores, labels)


def margin_loss(pos_score: torch.Tensor, neg_score: torch.Tensor, margin: float = 1.0) -> torch.Tensor:
    """Hinge ranking loss ``mean(relu(margin - pos + neg))`` over each positive and its own negatives.

    Args:
        pos_score: ``(P,)``.
        neg_score: ``(P * k,)`` with negative ``i * k + j`` of positive ``i`` (the layout of
            ``Uniform(k)`` and ``DegreeBiased(k)``), or ``(P, k)``.
    """
    pos = pos_score.reshape(-1)
    if len(pos) == 0 or neg_score.numel() % len(pos):
        raise InputError(
            f"margin_loss pairs each positive with k negatives: {neg_score.numel()} negatives for {len(pos)} "
            "positives (a per-source negative sampler has no such layout; use bce_loss)"
        )
    neg = neg_score.reshape(len(pos), -1)
    return F.relu(margin - pos[:, None] + neg).mean()
