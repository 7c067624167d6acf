"""A temporal job's plan: the stream and its time-sorted CSR, the i/j/k parallelism, the chronological split and
the memory copies' segments of training batches (:func:`distgnn.temporal.job.prepare` makes it before any
process starts; every trainer's :class:`~distgnn.temporal.loop.TemporalLoop` follows it)."""

from __future__ import annotations

from dataclasses import dataclass

from distgnn.data.events import EventStream
from distgnn.temporal.graph import TemporalCSR
from distgnn.temporal.parallel import Parallelism


@dataclass
class Plan:
    """What every trainer agrees on before starting: the stream, its split, the batches, the parallelism; and
    the stream's CSR (None in the ``--local`` launcher, which trains nothing)."""

    events: EventStream
    train_end: int
    val_end: int
    train_batches: list[tuple[int, int]]
    parallelism: Parallelism
    csr: TemporalCSR | None = None
    reason: str = "flags"  # why this parallelism (DistTGL's rule, or the flags)

    @property
    def first_trained_batch(self) -> int:
        """Index of the oldest batch trained: the ``batches mod k`` before it are left out."""
        return len(self.train_batches) % self.parallelism.memory

    def segment(self, index: int) -> list[tuple[int, int]]:
        """The training batches of time segment ``index`` (of k): equal segments (oldest leftover batches dropped)."""
        per_copy = len(self.train_batches) // self.parallelism.memory
        first = self.first_trained_batch + index * per_copy
        return self.train_batches[first : first + per_copy]

    def segment_of(self, copy: int, epoch: int) -> int:
        """The segment memory copy ``copy`` trains in ``epoch``: ``(copy + epoch) mod k`` (DistTGL's staggered
        copies; each epoch's memory is warmed afresh, :func:`distgnn.temporal.loop._start_segment`)."""
        return (copy + epoch) % self.parallelism.memory

    def evaluator_copy(self, epoch: int) -> int:
        """The copy that trained the last segment in ``epoch``: its memory stands where validation starts."""
        k = self.parallelism.memory
        return (k - 1 - epoch) % k
