"""Link prediction heads: scorers of node-embedding pairs and the losses that train them.

On a heterogeneous graph the edge loader gives pair graphs per edge type (``{canonical etype:
PairGraph}``); :class:`TypedPredictor` holds one scorer per edge type and the losses take the
resulting ``{etype: scores}`` as well as plain tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from distgnn.data.hetero import CanonicalEtype, etype_str
from distgnn.errors import InputError

Scores = torch.Tensor | Mapping[CanonicalEtype, torch.Tensor]


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
    """``(P,)`` scores of a :class:`~distgnn.loader.edge.PairGraph`'s pairs from ``h``, the
    ``(num_output_nodes, d)`` embeddings of its output nodes."""
    return predictor(h[pairs.src], h[pairs.dst])


class TypedPredictor(nn.Module):
    """One pair scorer per canonical edge type (e.g. a :class:`DotPredictor` or :class:`MLPPredictor` each).

    Args:
        etypes: the canonical edge types ``(src, rel, dst)`` to score.
        make_predictor: builds one scorer (called once per edge type), e.g. ``DotPredictor``.

    ``forward(h, pairs)``: ``h`` ``(num_output_nodes, d)`` embeddings of a batch's output nodes, ``pairs``
    ``{etype: PairGraph}`` -> ``{etype: (P_t,) scores}`` (same keys and order).
    """

    def __init__(self, etypes: Iterable[CanonicalEtype], make_predictor: Callable[[], nn.Module]):
        super().__init__()
        self.etypes = [tuple(e) for e in etypes]
        if not self.etypes:
            raise InputError("a TypedPredictor needs at least one edge type to score")
        self.predictors = nn.ModuleDict({etype_str(e): make_predictor() for e in self.etypes})

    def forward(self, h: torch.Tensor, pairs: Mapping) -> dict[CanonicalEtype, torch.Tensor]:
        unknown = [e for e in pairs if tuple(e) not in self.etypes]
        if unknown:
            raise InputError(f"no scorer for edge types {unknown}; this predictor scores {self.etypes}")
        return {e: score_pairs(self.predictors[etype_str(e)], h, p) for e, p in pairs.items()}


def _flat(scores: Scores) -> torch.Tensor:
    """A ``{etype: scores}`` dict concatenated in its key order (a positive's negatives stay its own), or
    a tensor flattened."""
    if isinstance(scores, Mapping):
        parts = [s.reshape(-1) for s in scores.values()]
        return torch.cat(parts) if parts else torch.zeros(0)
    return scores.reshape(-1)


def bce_loss(pos_score: Scores, neg_score: Scores) -> torch.Tensor:
    """Binary cross-entropy of logits: positives labelled 1, negatives 0, averaged over all pairs
    (tensors, or ``{etype: scores}`` of a :class:`TypedPredictor`: over all types)."""
    pos_score, neg_score = _flat(pos_score), _flat(neg_score)
    scores = torch.cat([pos_score.reshape(-1), neg_score.reshape(-1)])
    labels = torch.cat([torch.ones_like(pos_score.reshape(-1)), torch.zeros_like(neg_score.reshape(-1))])
    return F.binary_cross_entropy_with_logits(scores, labels)


def margin_loss(pos_score: Scores, neg_score: Scores, margin: float = 1.0) -> torch.Tensor:
    """Hinge ranking loss ``mean(relu(margin - pos + neg))`` over each positive and its own negatives.

    Args:
        pos_score: ``(P,)``.
        neg_score: ``(P * k,)`` with negative ``i * k + j`` of positive ``i`` (the layout of
            ``Uniform(k)`` and ``DegreeBiased(k)``), or ``(P, k)``.
        Or both ``{etype: scores}`` with the same keys in the same order (a typed ``Uniform(k)`` batch).
    """
    if isinstance(pos_score, Mapping) != isinstance(neg_score, Mapping) or (
        isinstance(pos_score, Mapping) and list(pos_score) != list(neg_score)
    ):
        raise InputError("margin_loss needs positive and negative scores of the same edge types, in the same order")
    pos, neg_score = _flat(pos_score), _flat(neg_score)
    if len(pos) == 0 or neg_score.numel() % len(pos):
        raise InputError(
            f"margin_loss pairs each positive with k negatives: {neg_score.numel()} negatives for {len(pos)} "
            "positives (a per-source negative sampler has no such layout; use bce_loss)"
        )
    neg = neg_score.reshape(len(pos), -1)
    return F.relu(margin - pos[:, None] + neg).mean()
