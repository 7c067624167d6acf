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
rule for unset i, j, k (memory copies first, as many as the machines' memory holds; then epoch slots; then
batch shares), :func:`lr_multiplier` the learning-rate scaling for the batches a step averages.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass

import torch

from distgnn.errors import ConfigError

# Below this many events per trainer and step, splitting a batch costs more than it saves (on CPUs a share of a
# few dozen events is the floor).
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


@dataclass(frozen=True)
class Choice:
    """A parallelism and why: the flags', or what :func:`default_parallelism` chose and on what grounds."""

    parallelism: Parallelism
    reason: str


def default_parallelism(
    num_machines: int,
    trainers_per_machine: int,
    batch_size: int,
    num_train_batches: int,
    copy_bytes: int,
    copy_budget: int,
) -> Choice:
    """DistTGL's rule for choosing i, j, k from the stream and the hardware, in its order (from its paper as
    recalled: its text was not at hand, its code has no rule; docs/benchmarks-history.md):

    1. memory parallelism first, and always across machines (k >= machines): copies share no memory, so
       machines never exchange node memory (only gradients), and a copy trains as one trainer does, at its
       batch size and on fresh memory. Inside a machine, one copy per trainer as far as the machine holds
       them: ``copy_budget`` bytes for copies of ``copy_bytes`` each (node memory and mailbox of every node),
       and no more copies than training batches (each copy needs a segment of its own);
    2. the trainers a copy is left with go to epoch parallelism: j staggered epochs over the one copy (each
       trainer still trains whole batches of one trainer's size; the cost is memory up to j - 1 steps stale),
       as many as the copy's segment has batches;
    3. mini-batch parallelism last, for trainers j cannot take (a segment of fewer batches than trainers).
       DistTGL ranks it last because its i trainers each take a whole batch (the step's batch grows i-fold);
       distgnn's i splits one batch, so a share below :data:`MIN_EVENTS_PER_SHARE` events is noted in the reason.

    Trainers per copy are a divisor of the machine's trainers, so every copy has the same i and j."""
    q = trainers_per_machine
    fit = copy_budget // max(copy_bytes, 1)
    room = max(1, num_train_batches // num_machines)
    copies = max(c for c in _divisors(q) if c <= max(1, min(fit, room)))
    rest, k = q // copies, num_machines * copies
    per_copy = max(1, num_train_batches // k)
    j = max(d for d in _divisors(rest) if d <= per_copy)
    i = rest // j
    held = f"{copies} cop{'y' if copies == 1 else 'ies'} of {_megabytes(copy_bytes)}"
    why = [
        f"k = {k}: {num_machines} machine(s) x {held} (memory parallelism first; a machine holds one copy per "
        f"trainer while its {_megabytes(copy_budget)} for copies (room for {fit}) and its "
        f"{num_train_batches // num_machines} training batches allow)"
    ]
    if rest > 1:
        why.append(f"j = {j}: the {rest} trainers of each copy train staggered epochs over it (epoch parallelism next)")
    if i > 1:
        share = f"shares of {batch_size // i} events" + (
            f", below the {MIN_EVENTS_PER_SHARE} that pay for splitting"
            if batch_size // i < MIN_EVENTS_PER_SHARE
            else ""
        )
        why.append(f"i = {i}: a copy's segment has only {per_copy} batches for j, the rest split each batch ({share})")
    return Choice(Parallelism(i, j, k), "; ".join(why))


def copy_budget(device: str, trainers_per_machine: int) -> int:
    """Bytes a machine gives its memory copies: half its physical memory, where the copies live on the CPU;
    with ``cuda`` (a copy lives on its owner's GPU), half of a GPU's memory for each of the machine's
    trainers. Read on the host that plans the job, taken as the machines' hardware."""
    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory // 2 * trainers_per_machine
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _megabytes(size: int) -> str:
    return f"{size / 1e9:.1f} GB" if size >= 1e9 else f"{size / 1e6:.1f} MB"


LR_SCALINGS = ("linear", "sqrt", "none")


def lr_multiplier(parallelism: Parallelism, scaling: str) -> float:
    """What ``--lr-scaling`` multiplies the learning rate by, from the number of batches whose gradients one
    optimizer step averages, ``j * k`` (each of the k copies trains its own batch, each of a copy's j epoch
    slots its own; the i trainers of a slot split one batch, so i adds none): ``linear``, j * k, DistTGL's rule
    (it scales Adam's rate by its i * j * k trainers, as its mini-batch parallelism gives each of the i
    trainers a whole batch where distgnn's splits one); ``sqrt``, the square root of j * k (the rule for
    adaptive optimisers, whose step does not grow with the averaged gradient); ``none``, 1."""
    if scaling not in LR_SCALINGS:
        raise ConfigError(f"--lr-scaling must be one of {', '.join(LR_SCALINGS)}, got {scaling!r}")
    batches = parallelism.epoch * parallelism.memory
    return {"linear": float(batches), "sqrt": math.sqrt(batches), "none": 1.0}[scaling]


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


def from_args(
    args: argparse.Namespace, num_trainers: int, num_machines: int, num_train_batches: int, copy_bytes: int
) -> Choice:
    """The flags' i/j/k with unset ones filled in (then checked by :func:`check`); all unset: DistTGL's rule
    (:func:`default_parallelism`) for this job's machines, the stream's batches and a copy of ``copy_bytes``."""
    chosen = (args.minibatch_parallelism, args.epoch_parallelism, args.memory_parallelism)
    if any(v < 0 for v in chosen):
        raise ConfigError(f"--minibatch/epoch/memory-parallelism must be >= 0 (0: heuristic), got {chosen}")
    if not any(chosen):
        per_machine = num_trainers // max(num_machines, 1)
        budget = copy_budget(args.device, per_machine)
        return default_parallelism(num_machines, per_machine, args.batch_size, num_train_batches, copy_bytes, budget)
    i, j, k = (v or 1 for v in chosen)
    if not args.memory_parallelism:
        k = max(1, num_trainers // (i * j))
    if not args.minibatch_parallelism:
        i = max(1, num_trainers // (j * k))
    return Choice(Parallelism(i, j, k), "flags")


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
