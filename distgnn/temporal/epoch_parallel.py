"""Epoch parallelism: one trainer's epoch on DistTGL's staggered schedule (:mod:`distgnn.temporal.parallel` gives
the schedule and its semantics exactly).

:class:`StaggeredMemory` stands in for the runner's :class:`~distgnn.temporal.memory_group.MemoryGroup`: the
rows of every node a batch's j uses touch are read from the copy once, when the batch starts (:meth:`fetch`,
collective over the copy's trainers), and each use reads its rows from there; the writes of a batch's first
use wait in it until the step's write round (:meth:`flush`, collective), where the copy's owner applies them.
:func:`train_epoch_staggered` runs one epoch of one trainer on it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from distgnn.errors import DistGNNError
from distgnn.nn.temporal import NodeMemory
from distgnn.temporal.memory_group import MemoryGroup
from distgnn.temporal.parallel import Parallelism, share_of_batch, steps_per_epoch, work_at
from distgnn.temporal.train import EpochTiming, TGNRunner


@dataclass
class _Held:
    """The batch an epoch slot holds: this trainer's share ``[first, stop)`` of the batch starting at event
    ``begin``, its j negative sets (int64 [stop - first, 1] each) and the rows read for it."""

    begin: int
    first: int
    stop: int
    negatives: list[torch.Tensor]
    nodes: torch.Tensor  # int64 [U], sorted
    rows: NodeMemory  # U rows, row u for nodes[u]


class StaggeredMemory:
    """The memory a trainer of an epoch-parallel copy reads and writes through (the runner's ``group``).

    Args:
        group: the copy's group (all i * j trainers, owner first).
    """

    def __init__(self, group: MemoryGroup):
        self.group = group
        self.memory = group.memory
        self.held: _Held | None = None
        self.writing = False  # whether the running use is its batch's first (the one that writes)
        self._writes: tuple | None = None

    def state(self) -> dict[str, np.ndarray]:
        """The held batch as arrays, for a checkpoint taken mid-epoch ({} when none is held)."""
        held = self.held
        if held is None:
            return {}
        arrays = {
            "span": np.array([held.begin, held.first, held.stop], dtype=np.int64),
            "negatives": torch.stack(held.negatives).cpu().numpy(),
            "nodes": held.nodes.cpu().numpy(),
        }
        arrays.update({f"rows.{name}": array for name, array in held.rows.state().items()})
        return arrays

    def load_state(self, arrays: dict[str, np.ndarray], device: torch.device) -> None:
        """Holds the batch :meth:`state` saved (nothing when ``arrays`` is empty)."""
        if not arrays:
            self.held = None
            return
        begin, first, stop = (int(v) for v in arrays["span"])
        nodes = torch.from_numpy(np.array(arrays["nodes"])).to(device)
        rows = NodeMemory(len(nodes), self.group.memory_dim, self.group.edge_dim, device)
        rows.load_state({name: arrays[f"rows.{name}"] for name in NodeMemory.FIELDS})
        negatives = list(torch.from_numpy(np.array(arrays["negatives"])).to(device).unbind(0))
        self.held = _Held(begin, first, stop, negatives, nodes, rows)

    def fetch(self, held: _Held | None) -> None:
        """The read round of a step (collective): the trainers starting a batch pass it (its ``rows`` filled
        here from the copy), the others None."""
        if held is None:
            self.group.read(torch.empty(0, dtype=torch.int64))
            return
        held.rows = self.group.read(held.nodes)
        self.held = held

    def read(self, nodes: torch.Tensor) -> NodeMemory:
        """Rows of ``nodes`` (int64 [U]) from the held batch's, or zeros in an idle step (no batch held)."""
        if self.held is None:
            return NodeMemory(len(nodes), self.group.memory_dim, self.group.edge_dim, nodes.device)
        held = self.held
        position = torch.searchsorted(held.nodes, nodes).clamp(max=len(held.nodes) - 1)
        if not bool((held.nodes[position] == nodes).all()):
            raise DistGNNError(
                "epoch parallelism: a use of a batch read a node its first use did not fetch; the runner's node "
                "set and nodes_of() disagree (a change to TGNRunner.forward must be mirrored in nodes_of)"
            )
        view = NodeMemory(len(nodes), self.group.memory_dim, self.group.edge_dim, nodes.device)
        for name in NodeMemory.FIELDS:
            getattr(view, name).copy_(getattr(held.rows, name)[position])
        return view

    def commit(self, *writes) -> None:
        """Keeps the writes of a batch's first use for :meth:`flush` (other uses write nothing); the arguments
        are :meth:`MemoryGroup.commit`'s."""
        if self.writing:
            self._writes = writes

    def flush(self, edge_dim: int) -> None:
        """The write round of a step (collective): the first use's writes, or nothing, to the owner."""
        writes, self._writes = self._writes, None
        if writes is None:
            m, none = self.group.memory_dim, torch.empty(0, dtype=torch.int64)
            rows = torch.empty(0, m)
            feat = torch.empty(0, edge_dim) if edge_dim else None
            writes = (none, rows, none, none, torch.empty(0, dtype=torch.float64), rows, rows, feat)
        self.group.commit(*writes)


def nodes_of(runner: TGNRunner, first: int, stop: int, negatives: list[torch.Tensor], cutoff: int) -> torch.Tensor:
    """int64 [U] sorted: every node :meth:`TGNRunner.forward` reads for events ``[first, stop)`` against any of
    ``negatives`` (the roots and their sampled neighbours before event ``cutoff``), as it computes them."""
    roots = torch.unique(torch.cat([runner.src[first:stop], runner.dst[first:stop], *(n.flatten() for n in negatives)]))
    hop = runner.sampler.sample(roots, runner.time[cutoff].expand(len(roots)).contiguous())[0]
    filled = torch.where(hop.mask, hop.neighbors, roots.unsqueeze(1))
    return torch.unique(torch.cat([roots, filled.flatten()]))


def _loss(pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(pos, torch.ones_like(pos)) + F.binary_cross_entropy_with_logits(
        neg, torch.zeros_like(neg)
    )


def train_epoch_staggered(
    runner: TGNRunner,
    ranges: list[tuple[int, int]],
    optimizer: torch.optim.Optimizer,
    net: torch.nn.Module,
    parallelism: Parallelism,
    rank: int,
    memory: StaggeredMemory,
    on_step: Callable[[int, float | None], None] | None = None,
    start_step: int = 0,
) -> tuple[float, EpochTiming]:
    """One epoch of trainer ``rank`` over its copy's batches ``ranges`` (``B + j - 1`` steps, each a DDP step of
    every trainer; ``on_step(index, loss)`` after each, index counted from ``start_step``, loss None in an idle
    step), from a memory the caller has reset or warmed, or from step ``start_step`` of a resumed epoch (the
    held batch restored by :meth:`StaggeredMemory.load_state`). Returns the mean loss of its busy steps and
    the timing (events: the batches' events, each trained j times)."""
    j, slot = parallelism.epoch, parallelism.slot_of(rank)
    share = (parallelism.share_of(rank), parallelism.minibatch)
    runner.model.train()
    start = time.perf_counter()
    losses = []
    num_batches = len(ranges)
    for step in range(start_step, steps_per_epoch(num_batches, j)):
        if step < num_batches:
            begin, end = ranges[step]
            drawn = [runner.negatives(end - begin, 1) for _ in range(j)]  # every trainer draws: equal streams
            starting = None
            if work_at(step, slot, j, num_batches) == (step, 0):
                first, stop = share_of_batch(begin, end, *share)
                mine = [n[first - begin : stop - begin] for n in drawn]
                nodes = nodes_of(runner, first, stop, mine, begin)
                starting = _Held(begin, first, stop, mine, nodes, None)
            memory.fetch(starting)
        work = work_at(step, slot, j, num_batches)
        if work is None:
            memory.held = None  # idle: a one-event pass on zero rows keeps DDP's collectives in step
            origin = ranges[0][0]
            out = runner.forward(origin, origin + 1, runner.dst[origin : origin + 1].unsqueeze(1), net)
            loss = _loss(out.pos, out.neg) * 0.0
        else:
            held = memory.held
            memory.writing = work[1] == 0
            out = runner.forward(held.first, held.stop, held.negatives[work[1]], net, cutoff=held.begin)
            loss = _loss(out.pos, out.neg)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if work is not None:
            out.commit()
            losses.append(float(loss.detach()))
        if step < num_batches:
            memory.flush(runner.edge_dim)
        if on_step is not None:  # every step, so that all trainers count steps alike; after the step's writes
            on_step(step - start_step, losses[-1] if work is not None else None)
    elapsed = time.perf_counter() - start
    memory.held = None
    return float(np.mean(losses)) if losses else 0.0, EpochTiming(elapsed, sum(e - b for b, e in ranges))
