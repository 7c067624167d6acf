"""Ranking metrics of link prediction (MRR, hits@k, AUC), on one trainer or over all of them.

Every held-out positive pair is scored against its own ``K`` negatives: ``pos`` is ``(P,)``,
``neg`` is ``(P, K)``. A positive's rank counts the negatives scored above it, ties as half
(the mean of the optimistic and pessimistic rank), so a constant scorer gets no credit.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.distributed as dist

from distgnn.errors import InputError


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
    world = dist.get_world_size()
    sizes = [torch.zeros(2, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([len(pos), neg.shape[1]], dtype=torch.int64))
    if len({int(s[1]) for s in sizes}) != 1:
        raise InputError(f"every trainer must score the same number of negatives, got {[int(s[1]) for s in sizes]}")
    most = max(int(s[0]) for s in sizes)
    rows = torch.zeros(most, 1 + neg.shape[1])
    rows[: len(pos), 0] = pos
    rows[: len(pos), 1:] = neg
    gathered = [torch.empty_like(rows) for _ in range(world)]
    dist.all_gather(gathered, rows)
    table = torch.cat([g[: int(s[0])] for g, s in zip(gathered, sizes, strict=True)])
    return table[:, 0], table[:, 1:]


def dist_link_metrics(pos: torch.Tensor, neg: torch.Tensor, hits: Sequence[int] = (1, 10, 50)) -> dict[str, float]:
    """:func:`link_metrics` over the pairs of all trainers (collective; see :func:`gather_scores`)."""
    return link_metrics(*gather_scores(pos, neg), hits)
