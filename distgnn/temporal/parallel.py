"""DistTGL's parallelisms: how i * j * k trainers share an event stream.

* mini-batch parallelism ``i``: i trainers split each chronological batch into i contiguous shares and use one
  memory copy, whose reads and writes one owner (the copy's first trainer) serialises;
* epoch parallelism ``j``: j epoch slots (of i trainers each) train j epochs at once over one memory copy,
  staggered by one batch (below);
* memory parallelism ``k``: k memory copies, each over its own contiguous time segment of the training
  batches; copies share only weights (DDP averages gradients). :mod:`distgnn.temporal.job` says how a copy's
  memory starts its segment warm.

Trainer ``rank`` is in memory copy ``rank // (i * j)``, epoch slot ``(rank // i) % j``, and holds share
``rank % i`` of each batch; the copy's owner is its first trainer.

Epoch parallelism, exactly (DistTGL's schedule). A copy's segment has batches ``0 .. B-1``; an epoch of the
job (one pass of the memory over the segment) has ``B + j - 1`` steps. Batch ``b`` belongs to slot
``b mod j``, which trains it at steps ``b, b+1, .., b+j-1``; its ``e``-th use (step ``b + e``) is epoch ``e``
of the batch and scores it against the e-th of the j negative sets drawn for it. At step ``t``:

1. read: slot ``t mod j`` starts batch ``t``: the copy's trainers draw its j negative sets (every trainer of
   the copy draws them, so their random streams stay equal; each share takes its rows), and the slot reads,
   from the copy, the memory and mail of every node any of the j uses will touch (the roots and their
   sampled neighbours): the copy as the writes of batches ``0 .. t-1`` left it;
2. train: every slot with a batch in use runs it against that use's negatives, with the weights of step t,
   on the rows it read (pending mail goes through the GRU with the current weights, differentiably); a slot
   with no batch (the first and last ``j - 1`` steps of an epoch) contributes a zero gradient; DDP averages the
   gradients of all trainers (over all copies) and every trainer takes the same optimizer step;
3. write: batch t's slot (its use 0, just trained) hands its writes to the owner: the memory its nodes read
   (mail applied, as the GRU of step t computed it) and the batch's events as mail. Uses 1 .. j-1 write
   nothing.

So the memory is read and written once per batch, in batch order, and each batch is trained j times with
j different negative sets and weights that moved on by 1 .. j-1 steps; the memory a late use reads is the
one of its batch's first use (its nodes' mail is applied again with newer weights). With j = 1 this is
the plain chronological loop.

:func:`check` rejects bad configurations before any process starts; :func:`default_parallelism` is DistTGL's
heuristic.
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

    @property
    def trainers_per_copy(self) -> int:
        return self.minibatch * self.epoch

    def copy_of(self, rank: int) -> int:
        """The memory copy trainer ``rank`` works on."""
        return rank // self.trainers_per_copy

    def slot_of(self, rank: int) -> int:
        """The epoch slot (of the j) trainer ``rank`` is in."""
        return (rank // self.minibatch) % self.epoch

    def share_of(self, rank: int) -> int:
        """Which of the i shares of each batch trainer ``rank`` takes."""
        return rank % self.minibatch

    def owner_of(self, copy: int) -> int:
        """The rank that owns memory copy ``copy`` (its first trainer)."""
        return copy * self.trainers_per_copy

    def ranks_of(self, copy: int) -> list[int]:
        """The trainers of memory copy ``copy``, owner first (slot by slot, share by share)."""
        return list(range(self.owner_of(copy), self.owner_of(copy) + self.trainers_per_copy))

    def describe(self) -> str:
        return f"i={self.minibatch} (mini-batch) x j={self.epoch} (epoch) x k={self.memory} (memory)"


def default_parallelism(num_machines: int, trainers_per_machine: int, batch_size: int) -> Parallelism:
    """DistTGL's heuristic for this hardware: memory parallelism across machines (k >= machines, they never
    exchange memory); inside a machine, mini-batch parallelism first (it keeps the batch and so the accuracy
    of one trainer) as long as each trainer's share stays at least :data:`MIN_EVENTS_PER_SHARE` events, the
    machine's remaining trainers as further memory copies. It leaves j = 1: epoch parallelism is chosen by
    the flag only."""
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
    group.add_argument(
        "--epoch-parallelism",
        type=int,
        default=0,
        metavar="J",
        help="epochs in flight over one memory copy: each batch is trained j times (j negative sets) by one\n"
        "of j staggered trainer slots; the memory is read and written once per batch",
    )
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
    if j > num_train_batches // k:
        raise ConfigError(
            f"--epoch-parallelism {j} is more than the {num_train_batches // k} batches of a memory copy's segment: "
            "a slot would never get a batch; lower j or --batch-size"
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


def steps_per_epoch(num_batches: int, epoch_slots: int) -> int:
    """Steps of one epoch of a copy with ``num_batches`` batches and j = ``epoch_slots`` (``B + j - 1``)."""
    return num_batches + epoch_slots - 1


def work_at(step: int, slot: int, epoch_slots: int, num_batches: int) -> tuple[int, int] | None:
    """``(batch, use)`` that epoch slot ``slot`` trains at ``step`` of an epoch, or None when it has none.

    Slot s owns the batches ``b = s (mod j)`` and trains each at steps ``b .. b + j - 1`` (use = step - b)."""
    batch = step - (step - slot) % epoch_slots
    if batch < 0 or batch >= num_batches:
        return None
    return batch, step - batch
