"""Warming a memory copy up: the events before a copy's time segment replayed through its memory only.

Under memory parallelism a copy that starts training mid-stream would start from an empty memory. At every
epoch's start, :func:`replay_memory` applies the earlier events in chunks the size of a training batch, the
way training applies a batch after its step (:meth:`~distgnn.temporal.train.BatchOutput.commit`): the chunk's
endpoints read their memory (pending mail through the GRU, with the current weights), that memory is written
back, and the chunk's events become mail. No sampling, no attention, no gradient: the GRU on the mail of each
chunk's endpoints, a small fraction of a training step. What it leaves out against training on those events:
the memory of a chunk's negatives and sampled neighbours is not refreshed (their mail stays pending, applied
when they are next read).
"""

from __future__ import annotations

import torch

from distgnn.nn.temporal import TGN, NodeMemory


@torch.no_grad()
def replay_memory(
    model: TGN,
    memory: NodeMemory,
    src: torch.Tensor,
    dst: torch.Tensor,
    time: torch.Tensor,
    feat: torch.Tensor | None,
    ranges: list[tuple[int, int]],
) -> None:
    """Applies events ``[begin, end)`` of each of ``ranges``, in order, to ``memory``.

    Args:
        model: whose GRU updates the memory (its weights as they are).
        memory: the copy, moved forward in place.
        src, dst: int64 [E] endpoints of the whole stream; time: float64 [E]; feat: float32 [E, d_e] or None.
        ranges: consecutive event ranges (training batches' size).
    """
    for begin, end in ranges:
        chunk_src, chunk_dst = src[begin:end], dst[begin:end]
        nodes, inverse = torch.unique(torch.cat([chunk_src, chunk_dst]), return_inverse=True)
        rows = model.read_memory(memory, nodes)
        memory.write_memory(nodes, rows)
        count = end - begin
        chunk_feat = None if feat is None else feat[begin:end]
        memory.store_mail(
            chunk_src, chunk_dst, time[begin:end], rows[inverse[:count]], rows[inverse[count:]], chunk_feat
        )
