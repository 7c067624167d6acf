"""DistTGL's parallelisms: how i * j * k trainers share an event stream.

* mini-batch parallelism ``i``: i trainers split each chronological batch into i contiguous shares and use one
  memory copy, whose reads and writes one owner (the group's first trainer) serialises;
* epoch parallelism ``j``: j epochs in flight over one memory copy (not built yet: j must be 1);
* memory parallelism ``k``: k memory copies, copy c trains on the c-th contiguous time segment of the training
  batches, resetting its memory at the segment's start; copies share only weights (DDP averages gradients).

Trainer ``rank`` is in memory copy ``rank // i`` and holds share ``rank % i`` of each batch. :func:`check`
rejects bad configurations before any process starts; :func:`default_parallelism` is DistTGL's heuristic.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from distgnn.errors import ConfigError

# Below this many events per trainer and step, splitting a batch costs more than it saves (DistTGL keeps
# each GPU's share of a batch large enough to fill it; on CPUs a share of a few dozen events is the floor).
MIN_EVENTS_PER_SHARE = 50


@dataclass(frozen=True)
class Parallelism:
    """``minibatch`` (i), ``epoch`` (j), ``memory`` (k); ``i * j * k`` trainers."""

    minibatch: int = 1
    epoch: int = 1
    memory: int = 1

    @property
    def num_trainers(self) -> int:
        return self.minibatch * self.epoch * self.memory

    def copy_of(self, rank: int) -> int:
        """The memory copy trainer ``rank`` works on."""
        return rank // self.minibatch

    def share_of(self, rank: int) -> int:
        """Which of the i shares of each batch trainer ``rank`` takes."""
        return rank % self.minibatch

    def owner_of(self, copy: int) -> int:
        """The rank that owns memory copy ``copy`` (its group's first trainer)."""
        return copy * self.minibatch

    def describe(self) -> str:
        return f"i={self.minibatch} (mini-batch) x j={self.epoch} (epoch) x k={self.memory} (memory)"


def default_parallelism(num_machines: int, trainers_per_machine: int, batch_size: int) -> Parallelism:
    """DistTGL's heuristic for this hardware: memory parallelism across machines (k >= machines, they never
    exchange memory); inside a machine, mini-batch parallelism first (it keeps the batch and so the accuracy
    of one trainer) as long as each trainer's share stays at least :data:`MIN_EVENTS_PER_SHARE` events, the
    machine's remaining trainers as further memory copies (epoch parallelism is not built)."""
    i = 1
    for candidate in range(trainers_per_machine, 0, -1):
        if trainers_per_machine % candidate == 0 and batch_size // candidate >= MIN_EVENTS_PER_SHARE:
            i = candidate
            break
    return Parallelism(i, 1, num_machines * (trainers_per_machine // i))


def add_parallel_args(parser: argparse.ArgumentParser) -> None:
    """``--minibatch-parallelism i --epoch-parallelism j --memory-parallelism k`` (0: the heuristic's)."""
    group = parser.add_argument_group("DistTGL parallelism (i * j * k = trainers; 0: DistTGL's heuristic)")
    group.add_argument("--minibatch-parallelism", type=int, default=0, metavar="I", help="trainers per batch")
    group.add_argument("--epoch-parallelism", type=int, default=0, metavar="J", help="epochs in flight (only 1)")
    group.add_argument("--memory-parallelism", type=int, default=0, metavar="K", help="memory copies")


def from_args(args: argparse.Namespace, num_trainers: int, num_machines: int) -> Parallelism:
    """The flags' i/j/k with unset ones filled in by the heuristic (then checked by :func:`check`)."""
    chosen = (args.minibatch_parallelism, args.epoch_parallelism, args.memory_parallelism)
    if any(v < 0 for v in chosen):
        raise ConfigError(f"--minibatch/epoch/memory-parallelism must be >= 0 (0: heuristic), got {chosen}")
    if not any(chosen):
        return default_parallelism(num_machines, num_trainers // max(num_machines, 1), args.batch_size)
    i, j, k = (v or 1 for v in chosen)
    if not args.memory_parallelism:
        k = max(1, num_trainers // (i * j))
    if not args.minibatch_parallelism:
        i = max(1, num_trainers // (j * k))
    return Parallelism(i, j, k)


def check(parallelism: Parallelism, num_trainers: int, num_train_batches: int, batch_size: int) -> None:
    """Raises ConfigError naming the flag when the configuration cannot run."""
    i, j, k = parallelism.minibatch, parallelism.epoch, parallelism.memory
    if j != 1:
        raise ConfigError(
            f"--epoch-parallelism {j}: epoch parallelism is not built yet; use --epoch-parallelism 1 and give "
            "the trainers to --memory-parallelism or --minibatch-parallelism"
        )
    if i * j * k != num_trainers:
        raise ConfigError(
            f"--minibatch-parallelism {i} x --epoch-parallelism {j} x --memory-parallelism {k} = {i * j * k} "
            f"trainers, but the job has {num_trainers} (--num-parts x --trainers-per-machine); make them match"
        )
    if k > num_train_batches:
        raise ConfigError(
            f"--memory-parallelism {k} is more than the {num_train_batches} training batches: each memory copy "
            "needs its own time segment of at least one batch; lower k or --batch-size"
        )
    if i > batch_size:
        raise ConfigError(f"--minibatch-parallelism {i} splits a batch of {batch_size} events into empty shares")


def segment_of(copy: int, num_copies: int, num_batches: int) -> tuple[int, int]:
    """``(first, stop)`` training batch indices of memory copy ``copy``: contiguous, sizes differ by <= 1."""
    base, extra = divmod(num_batches, num_copies)
    first = copy * base + min(copy, extra)
    return first, first + base + (1 if copy < extra else 0)


def share_of_batch(begin: int, end: int, share: int, num_shares: int) -> tuple[int, int]:
    """Events of share ``share`` of the batch ``[begin, end)``: contiguous, sizes differ by <= 1."""
    base, extra = divmod(end - begin, num_shares)
    first = begin + share * base + min(share, extra)
    return first, first + base + (1 if share < extra else 0)
