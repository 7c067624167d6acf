"""Ranking metrics of link prediction (MRR, hits@k, AUC), on one trainer or over all of them.

Every held-out positive pair is scored against its own ``K`` negatives: ``pos`` is ``(P,)``,
``neg`` is ``(P, K)``. A positive's rank counts the negatives scored above it, ties as half
(the mean of the optimistic and pessimistic rank), so a constant scorer gets no credit.
:func:`held_out_metrics` scores a link split's validation and test pairs, each trainer its share,
from any source of node embeddings (layer-wise inference, sampled blocks).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch
import torch.distributed as dist

from distgnn.errors import InputError
from distgnn.train.collective import all_gather_arrays


def _check(pos: torch.Tensor, neg: torch.Tensor) -> None:
    if pos.ndim != 1 or neg.ndim != 2 or neg.shape[0] != pos.shape[0]:
        raise InputError(f"expected pos (P,) and neg (P, K) scores, got {tuple(pos.shape)} and {tuple(neg.shape)}")


def ranks(pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """``(P,)`` float64 rank of each positive among itself and its negatives (1 = best)."""
    _check(pos, neg)
    above = (neg > pos[:, None]).sum(1)
    ties = (neg == pos[:, None]).sum(1)
    return 1.0 + above.double() + 0.5 * ties.double()


def auc(pos: torch.Tensor, neg: torch.Tensor) -> float:
    """Area under the ROC curve of all positive against all negative scores (ties count half)."""
    from scipy.stats import rankdata

    pos_np = pos.detach().reshape(-1).double().cpu().numpy()
    neg_np = neg.detach().reshape(-1).double().cpu().numpy()
    if len(pos_np) == 0 or len(neg_np) == 0:
        raise InputError(f"AUC needs positive and negative scores, got {len(pos_np)} and {len(neg_np)}")
    r = rankdata(np.concatenate([pos_np, neg_np]))[: len(pos_np)]
    return float((r.sum() - len(pos_np) * (len(pos_np) + 1) / 2) / (len(pos_np) * len(neg_np)))


def link_metrics(pos: torch.Tensor, neg: torch.Tensor, hits: Sequence[int] = (1, 10, 50)) -> dict[str, float]:
    """``{"mrr", "hits@k" for k in hits, "auc", "num_pairs"}`` of pos ``(P,)`` against neg ``(P, K)``."""
    r = ranks(pos, neg)
    if len(r) == 0:
        raise InputError("no positive pairs to evaluate")
    out = {"mrr": float((1.0 / r).mean())}
    out.update({f"hits@{k}": float((r <= k).double().mean()) for k in hits})
    out["auc"] = auc(pos, neg)
    out["num_pairs"] = len(r)
    return out


def gather_scores(pos: torch.Tensor, neg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every trainer's ``pos`` ``(P_r,)`` and ``neg`` ``(P_r, K)`` scores concatenated in rank order, on CPU.

    Collective over the default torch.distributed group (every trainer calls it, with the same ``K``);
    the identity in a single process.
    """
    _check(pos, neg)
    pos, neg = pos.detach().float().cpu(), neg.detach().float().cpu()
    if not (dist.is_available() and dist.is_initialized()):
        return pos, neg
    rows = torch.cat([pos[:, None], neg], 1)
    try:
        table = torch.cat(all_gather_arrays(rows))
    except InputError as exc:
        raise InputError(f"every trainer must score the same number of negatives: {exc}") from None
    return table[:, 0], table[:, 1:]


def dist_link_metrics(pos: torch.Tensor, neg: torch.Tensor, hits: Sequence[int] = (1, 10, 50)) -> dict[str, float]:
    """:func:`link_metrics` over the pairs of all trainers (collective; see :func:`gather_scores`)."""
    return link_metrics(*gather_scores(pos, neg), hits)


def held_out_metrics(
    embed: Callable[[np.ndarray], torch.Tensor],
    predictor: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    held_out: Mapping[str, np.ndarray],
    rank: int = 0,
    world_size: int = 1,
    rows_per_step: int = 10000,
    hits: Sequence[int] = (1, 10, 50),
) -> dict[str, float]:
    """``{"val_mrr", "val_hits@k", "val_auc", "val_num_pairs", "test_...": ...}`` of a link split.

    Each trainer scores ``np.array_split(pairs, world_size)[rank]`` of each split against their negatives,
    a few pairs at a time (at most ``rows_per_step`` node embeddings per step), and the metrics are over all
    trainers' pairs (:func:`dist_link_metrics`: collective, every trainer calls it). A split without pairs
    is left out.

    Args:
        embed: ``(n,)`` int64 sorted unique node ids -> ``(n, d)`` their embeddings (on any one device).
        predictor: ``predictor(h_src, h_dst)`` scores broadcast pairs of embeddings, ``(P, d)`` with ``(P, d)``
            -> ``(P,)`` and ``(P, 1, d)`` with ``(P, K, d)`` -> ``(P, K)`` (as :class:`distgnn.nn.DotPredictor`).
        held_out: ``{split}_pairs`` ``(P, 2)`` and ``{split}_negatives`` ``(P, K)`` int64 node ids for
            ``split`` in val and test (:meth:`distgnn.data.link_split.LinkSplit.held_out`).
    """
    result = {}
    for split in ("val", "test"):
        if len(held_out[f"{split}_pairs"]) == 0:
            continue
        pairs = np.array_split(held_out[f"{split}_pairs"], world_size)[rank]
        negs = np.array_split(held_out[f"{split}_negatives"], world_size)[rank]
        step = max(1, rows_per_step // (negs.shape[1] + 2))  # pairs per step
        pos_scores, neg_scores = [torch.zeros(0)], [torch.zeros(0, negs.shape[1])]
        with torch.no_grad():
            for start in range(0, len(pairs), step):
                p, n = pairs[start : start + step], negs[start : start + step]
                nodes, inverse = np.unique(np.concatenate([p[:, 0], p[:, 1], n.reshape(-1)]), return_inverse=True)
                h = embed(nodes)
                h = h[torch.from_numpy(inverse).to(h.device)]
                h_src, h_dst, h_neg = h[: len(p)], h[len(p) : 2 * len(p)], h[2 * len(p) :].view(len(p), -1, h.shape[1])
                pos_scores.append(predictor(h_src, h_dst).float().cpu())
                neg_scores.append(predictor(h_src[:, None], h_neg).float().cpu())
        metrics = dist_link_metrics(torch.cat(pos_scores), torch.cat(neg_scores), hits)
        result.update({f"{split}_{k}": v for k, v in metrics.items()})
    return result
