"""Gather ahead: batch t+1 moves to the GPU and gets its features on a side stream while batch t trains.

With a loader that samples in the background (``prefetch > 0`` or sampler
workers: batch t+2), :class:`GatherAhead` makes the three-stage pipeline of a
GPU trainer: sample t+2, gather t+1, train t. Batches come from the loader on
the CPU; for each one, on its own CUDA stream, the blocks and prefetched node
data are copied to the device and the input features read through a
:class:`~distgnn.cache.dist_feature.CachedFeature` (ids taken from the CPU
copy, so no device-to-host sync), and an event marks the batch ready. The
trainer's stream waits on that event only when the batch is handed out, by
which time the work for batch t has been queued behind it. Every tensor of a
handed-out batch is recorded on the consumer's stream, so the caching
allocator does not reuse its memory early.

On a CPU device there is nothing to overlap: batches get their features
inline, in order, with the same results.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from distgnn.loader.node import MiniBatch


class GatherAhead:
    """Iterates ``(batch_on_device, features)`` over ``batches``, one batch gathered ahead.

    Args:
        batches: MiniBatches on the CPU (a ``DistNodeDataLoader`` built with ``device="cpu"``).
        features: maps a CPU id tensor to its feature rows on ``device``: a function, or anything indexed
            by ids (a ``CachedFeature``).
        device: where batches and features go.
    """

    def __init__(self, batches: Iterable[MiniBatch], features: Callable[[torch.Tensor], torch.Tensor] | Any, device):
        self.batches = batches
        self.features = features if callable(features) else features.__getitem__  # a CachedFeature is indexed
        self.device = torch.device(device)
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def __len__(self) -> int:
        return len(self.batches)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[tuple[MiniBatch, torch.Tensor]]:
        source = iter(self.batches)
        try:
            if self._stream is None:
                for batch in source:
                    yield batch.to(self.device), self.features(batch[0])
                return
            pending = None
            for batch in source:
                issued = self._issue(batch)
                if pending is not None:
                    yield self._hand_out(*pending)
                pending = issued
            if pending is not None:
                yield self._hand_out(*pending)
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()  # an epoch left early: the loader cancels the batches it has in flight

    def _issue(self, batch: MiniBatch) -> tuple[MiniBatch, torch.Tensor, torch.cuda.Event]:
        with torch.cuda.stream(self._stream):
            on_device = batch.to(self.device, non_blocking=True)
            features = self.features(batch[0])
            ready = torch.cuda.Event()
            ready.record(self._stream)
        return on_device, features, ready

    def _hand_out(self, batch: MiniBatch, features: torch.Tensor, ready: torch.cuda.Event):
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_event(ready)
        for tensor in (*batch.tensors(), features):
            tensor.record_stream(consumer)
        return batch, features
