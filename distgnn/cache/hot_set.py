"""Choosing which feature rows to cache: by pre-sampled access frequency, with in-degree as the fallback.

Sampling a few hundred batches from a trainer's own seeds before training shows which rows its batches
touch; those counts rank the nodes, in-degree breaks ties and ranks nodes that no sampled batch touched.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from distgnn.errors import ConfigError, InputError

Samples = Iterable[torch.Tensor] | Callable[[], torch.Tensor]


def access_frequency(samples: Samples, num_nodes: int, num_batches: int = 200) -> torch.Tensor:
    """How often each node appears in sampled batches.

    Args:
        samples: the input-node id tensors of sampled batches, or a callable returning one batch's ids per call
            (called ``num_batches`` times).
        num_nodes: N; every id must be in ``[0, N)``.
        num_batches: calls of a callable ``samples`` (ignored for an iterable).

    Returns:
        ``(N,)`` int64 counts, on the device of the sampled ids.
    """
    batches = (samples() for _ in range(num_batches)) if callable(samples) else samples
    counts: torch.Tensor | None = None
    for batch in batches:
        batch = batch.reshape(-1).to(torch.int64)
        if counts is None:
            counts = torch.zeros(num_nodes, dtype=torch.int64, device=batch.device)
        if batch.numel():
            low, high = (int(v) for v in torch.aminmax(batch))
            if low < 0 or high >= num_nodes:
                raise InputError(f"sampled ids must lie in [0, {num_nodes}), got [{low}, {high}]")
        counts += torch.bincount(batch.to(counts.device), minlength=num_nodes)
    return torch.zeros(num_nodes, dtype=torch.int64) if counts is None else counts


def choose_hot_set(
    budget_bytes: int,
    row_bytes: int,
    num_nodes: int,
    *,
    samples: Samples | None = None,
    in_degree: torch.Tensor | None = None,
    num_batches: int = 200,
    frequency: torch.Tensor | None = None,
) -> torch.Tensor:
    """The ids to cache within ``budget_bytes``, hottest first.

    Nodes rank by sampled access count, then in-degree, then id. With no ``samples`` the in-degree alone ranks
    them (the fallback); nodes never sampled are ranked by in-degree behind every sampled one.

    Args:
        budget_bytes: cache bytes (for a clique: the whole clique's); ``budget_bytes // row_bytes`` rows fit.
        row_bytes: bytes of one feature row (``F * element_size``).
        num_nodes: N.
        samples: see :func:`access_frequency`.
        in_degree: ``(N,)`` in-degrees.
        num_batches: calls of a callable ``samples``.
        frequency: ``(N,)`` access counts already taken (e.g. :func:`access_frequency` summed over the trainers
            of a clique), instead of ``samples``.

    Returns:
        int64 ids, at most ``min(N, budget_bytes // row_bytes)`` of them, on the device of the ranking data.
    """
    if row_bytes <= 0 or budget_bytes < 0:
        raise ConfigError(f"need row_bytes > 0 and budget_bytes >= 0, got {row_bytes} and {budget_bytes}")
    if samples is None and in_degree is None and frequency is None:
        raise ConfigError("choose_hot_set needs sampled batches (samples=) or in-degrees (in_degree=) to rank nodes")
    if samples is not None and frequency is not None:
        raise ConfigError("give sampled batches (samples=) or their counts (frequency=), not both")
    capacity = min(num_nodes, budget_bytes // row_bytes)
    if samples is not None:
        frequency = access_frequency(samples, num_nodes, num_batches)
    device = frequency.device if frequency is not None else in_degree.device
    order = torch.arange(num_nodes, device=device)
    # Stable sorts from the last key to the first leave ties in id order.
    for key in (in_degree, frequency):
        if key is None:
            continue
        if key.shape != (num_nodes,):
            raise InputError(f"ranking keys must have shape ({num_nodes},), got {tuple(key.shape)}")
        key = key.to(device=device, dtype=torch.int64)[order]
        order = order[torch.sort(key, descending=True, stable=True).indices]
    return order[:capacity]
