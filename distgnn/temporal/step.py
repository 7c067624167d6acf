"""The TGN training step with every shape fixed by the batch size, replayed from a CUDA graph.

At 200 events a batch the eager step (:meth:`~distgnn.temporal.train.TGNRunner.train_batch`) is launch- and
host-bound on a GPU: a few hundred small kernels, each issued from Python, and host syncs for
``torch.unique``'s sizes, the memory read's ``nonzero`` and the sampler's range check. The dense step computes
the same loss, gradients and memory writes without any of them:

* no deduplication (:meth:`~distgnn.nn.temporal.TGN.forward_dense`): each of the R = B * (2 + q) roots and each
  of its k neighbour slots is a row of its own. A node in several rows reads the same memory in each, and
  autograd sums the rows' gradients, so scores and gradients are the eager step's up to the order of float
  additions;
* the GRU runs on every row; rows without pending mail keep their stored memory (``torch.where``);
* the memory and mailbox writes (:func:`write_dense`) are ``index_copy_`` with repeated indices, where every
  row of a node writes the values of the node's last row (found by a scatter-amax into an [N] scratch), so
  duplicates write the same bytes: the result is :meth:`NodeMemory.write_memory` then
  :meth:`NodeMemory.store_mail`'s, whatever the order of the writes.

:class:`DenseStep` on a GPU runs two dense steps eagerly on real batches (the optimiser's state and cuBLAS's
handles come to exist), then captures forward, loss, backward, the optimiser's step (Adam with
``capturable=True``) and the memory writes in one CUDA graph and replays it; a step's input is one
host-to-device copy of the batch's first event index and its negatives. On the CPU it runs the dense step
eagerly (what the tests compare against the eager step). One :class:`DenseStep` serves one batch size; a further
size of the same optimiser needs no eager step first (``warmups=0``) and may be captured before its first batch
(:meth:`DenseStep.capture`). Every capture goes through :func:`capture`.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F

from distgnn.errors import ConfigError
from distgnn.nn.temporal import TGN, NodeMemory
from distgnn.temporal.memory_group import MemoryGroup
from distgnn.temporal.sampler import TemporalSampler
from distgnn.train.grad_sync import GradSync

log = logging.getLogger(__name__)

STEP_MODES = ("auto", "eager", "graph")
WARMUP_STEPS = 2  # eager dense steps before the capture
HOST_BUFFERS = 4  # pinned input buffers of a captured step: how many steps the host may run ahead of the GPU


@dataclass
class BatchOutput:
    """Scores of one batch and the memory writes it leaves for after the optimizer step.

    Attributes:
        pos: float32 [B] logits of the batch's events.
        neg: float32 [B, q] logits of each event's source against q negative destinations.
        commit: applies the batch to the memory (call once, after the step).
    """

    pos: torch.Tensor
    neg: torch.Tensor
    commit: Callable[[], None] = field(repr=False)


class Runner(Protocol):
    """What the dense step reads of a :class:`~distgnn.temporal.train.TGNRunner`: the stream's tensors on the
    device, its sampler, model and memory copy."""

    device: torch.device
    model: TGN
    memory: NodeMemory | None
    group: MemoryGroup | None
    sampler: TemporalSampler
    src: torch.Tensor
    dst: torch.Tensor
    time: torch.Tensor
    feat: torch.Tensor | None


def capture(
    graph: torch.cuda.CUDAGraph, body: Callable[[], torch.Tensor | None], device: torch.device
) -> torch.Tensor | None:
    """Captures ``body()`` into ``graph`` (nothing runs until a replay) on one side stream of ``device``, in a
    memory pool of the graph's own; returns what ``body`` returns. As ``torch.cuda.graph``, after the device's
    work has finished, but without its garbage collection and its emptied allocator caches: those would make the
    eager work after a capture allocate afresh, and a job captures several graphs (a step per batch size, a
    replay per segment)."""
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    if index not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[index] = torch.cuda.Stream(index)
    with torch.cuda.device(index):
        torch.cuda.synchronize(index)
        with torch.cuda.stream(_CAPTURE_STREAMS[index]):
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                out = body()
            finally:
                graph.capture_end()
    return out


_CAPTURE_STREAMS: dict[int, torch.cuda.Stream] = {}


def link_loss(out: BatchOutput) -> torch.Tensor:
    """Binary cross-entropy of the events (label 1) plus that of the negatives (label 0)."""
    loss = F.binary_cross_entropy_with_logits(out.pos, torch.ones_like(out.pos))
    return loss + F.binary_cross_entropy_with_logits(out.neg, torch.zeros_like(out.neg))


def graph_unsupported(runner: Runner) -> str | None:
    """Why the CUDA graph step cannot train this runner's batches, or None when it can."""
    if runner.device.type != "cuda":
        return f"the device is {runner.device}, not a GPU"
    if runner.group is not None:
        return "the memory copy is shared by a mini-batch-parallel group (its collectives stay eager)"
    if runner.sampler.uniform or runner.sampler.hops != 1:
        return "the sampler is not one hop of the most recent neighbours"
    if runner.model.static is not None:
        return "the static node memory's embedding gradient is not captured"
    return None


def last_row(keys: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
    """int64 [n]: for each entry of ``keys`` (int64 [n]), the position of the last entry with the same key.
    ``scratch``: int64, one entry per possible key (overwritten where keys point)."""
    rows = torch.arange(len(keys), device=keys.device)
    scratch.scatter_reduce_(0, keys, rows, "amax", include_self=False)
    return scratch[keys]


def write_dense(
    memory: NodeMemory,
    nodes: torch.Tensor,
    rows: torch.Tensor,
    src: torch.Tensor,
    dst: torch.Tensor,
    time: torch.Tensor,
    edge_feat: torch.Tensor | None,
    scratch: torch.Tensor,
) -> None:
    """:meth:`NodeMemory.write_memory` of ``nodes`` (int64 [U], repeats allowed; each repeat holds the same
    memory in ``rows`` [U, m]), then :meth:`NodeMemory.store_mail` of the batch's events, whose source and
    destination memories are ``rows``' first 2B rows; with fixed shapes (``scratch``: int64 [N])."""
    last = last_row(nodes, scratch)
    pending = memory.has_mail[nodes]
    updated_at = torch.where(pending, memory.mail_time[nodes], memory.last_update[nodes])
    memory.memory.index_copy_(0, nodes, rows[last])
    memory.last_update.index_copy_(0, nodes, updated_at[last])
    memory.has_mail.index_fill_(0, nodes, False)
    num_events = len(src)
    src_rows, dst_rows = rows[:num_events], rows[num_events : 2 * num_events]
    feat = edge_feat if edge_feat is not None else rows.new_zeros(num_events, 0)
    # Event i's source is entry 2i, its destination 2i + 1: the last entry of a node is its last event's,
    # a destination after the source of the same event (as store_mail orders them).
    ends = torch.stack([src, dst], 1).flatten()
    messages = torch.stack([torch.cat([src_rows, dst_rows, feat], 1), torch.cat([dst_rows, src_rows, feat], 1)], 1)
    last = last_row(ends, scratch)
    memory.mail.index_copy_(0, ends, messages.flatten(0, 1)[last])
    memory.mail_time.index_copy_(0, ends, torch.stack([time, time], 1).flatten()[last])
    memory.has_mail.index_fill_(0, ends, True)


def dense_forward(runner: Runner, slots: torch.Tensor, num_events: int, scratch: torch.Tensor) -> BatchOutput:
    """:meth:`~distgnn.temporal.train.TGNRunner.forward` of ``num_events`` events from ``slots[0]`` (int64 [1 +
    B * q] on the runner's device: the first event's index, then the B * q negatives, event by event), with
    fixed shapes and no host sync; the runner holds its memory copy. ``scratch``: int64 [N] for the writes."""
    device, memory = runner.device, runner.memory
    first = slots[:1]
    index = first + torch.arange(num_events, device=device)
    src, dst, t = runner.src[index], runner.dst[index], runner.time[index]
    roots = torch.cat([src, dst, slots[1:]])
    # Neighbours strictly before the batch's first event, as the eager step samples them.
    hop = runner.sampler.sample_valid(roots, runner.time[first].expand(len(roots)))
    nodes = torch.cat([roots, torch.where(hop.mask, hop.neighbors, roots.unsqueeze(1)).flatten()])
    if runner.feat is not None:
        nbr_feat = runner.feat[hop.eids.clamp(min=0)] * hop.mask.unsqueeze(-1)
    else:
        nbr_feat = torch.zeros(*hop.mask.shape, 0, device=device)
    pos, neg, memory_rows = runner.model.forward_dense(memory, nodes, hop.times, nbr_feat, hop.mask, num_events)
    feat = None if runner.feat is None else runner.feat[index]

    def commit() -> None:
        write_dense(memory, nodes, memory_rows.detach(), src, dst, t, feat, scratch)

    return BatchOutput(pos, neg, commit)


class DenseStep:
    """Training steps of ``num_events`` events with ``per_event`` negatives each, on fixed shapes.

    Args:
        runner: holds the model, the memory copy (no group) and the stream on its device.
        optimizer: the model's; for the graph one with ``capturable=True`` where it has the flag (Adam).
        num_events, per_event: the batch's shape.
        graph: capture the step in a CUDA graph after ``warmups`` eager ones (GPU only); else every step runs
            the dense step eagerly.
        grad_sync: one of several trainers (memory copies) whose gradients are averaged: the step zeroes the
            flat gradient buffer, and all-reduces it between backward and the optimiser's step, inside the graph
            (the warm-ups' eager all-reduces set the communicator up before the capture). Every trainer must
            take the same number of steps.
        warmups: eager steps before the capture: :data:`WARMUP_STEPS` for an optimiser's first step; 0 where a
            step of the same optimiser (and GradSync) has run already, so its state and the communicator exist.

    ``step(begin, negatives)`` (``negatives`` int64 [B, q] on the CPU) trains events ``[begin, begin + B)``
    and returns the loss, a 0-d tensor on the device (rewritten by the next replay: read it before).
    """

    def __init__(
        self,
        runner: Runner,
        optimizer: torch.optim.Optimizer,
        num_events: int,
        per_event: int = 1,
        graph: bool = False,
        grad_sync: GradSync | None = None,
        warmups: int = WARMUP_STEPS,
    ) -> None:
        if runner.memory is None or runner.group is not None:
            raise ConfigError("the dense step trains a runner that holds its own memory copy (no group)")
        if graph:
            why_not = graph_unsupported(runner)
            if why_not:
                raise ConfigError(f"the CUDA graph step cannot run: {why_not}; pass --step eager")
            if any(group.get("capturable") is False for group in optimizer.param_groups):
                raise ConfigError("the CUDA graph step needs an optimizer made with capturable=True")
            if grad_sync is not None and not grad_sync.capturable:
                raise ConfigError(
                    "the CUDA graph step all-reduces gradients over NCCL; this group's cannot be captured"
                )
        self.runner, self.optimizer, self.num_events, self.graph = runner, optimizer, num_events, graph
        self.grad_sync, self.warmups = grad_sync, warmups
        device = runner.device
        size = 1 + num_events * per_event
        self.slots = torch.zeros(size, dtype=torch.int64, device=device)
        self._scratch = torch.zeros(runner.model.num_nodes, dtype=torch.int64, device=device)
        # A ring of pinned input buffers: the host waits for the copy out of a buffer only when it comes round
        # again, so it may run up to HOST_BUFFERS steps ahead of the GPU (with several GPUs, one rank's late
        # step then does not hold the host of the others).
        buffers = HOST_BUFFERS if graph else 1
        self._hosts = [torch.zeros(size, dtype=torch.int64, pin_memory=graph) for _ in range(buffers)]
        self._copies = [torch.cuda.Event() for _ in range(buffers)] if graph else []
        self._turn = 0
        self._graph: torch.cuda.CUDAGraph | None = None
        self._loss: torch.Tensor | None = None
        self._grads: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        self._warmups = 0

    def __call__(self, begin: int, negatives: torch.Tensor) -> torch.Tensor:
        self._load(begin, negatives)
        if not self.graph:
            self._zero_grad()
            return self._on_slots()
        if self._graph is None and self._warmups < self.warmups:
            return self._warmup()
        self.capture()
        self._graph.replay()
        # Another step's eager warm-up may have swapped in its own gradient tensors: point each parameter back
        # at the graph's, which this replay wrote (as after an eager step).
        for param, grad in self._grads:
            param.grad = grad
        return self._loss

    @property
    def captured(self) -> bool:
        return self._graph is not None

    @property
    def warmed(self) -> bool:
        """Whether the step has run its eager warm-ups (it may be captured)."""
        return self.graph and self._warmups >= self.warmups

    def _load(self, begin: int, negatives: torch.Tensor) -> None:
        host = self._hosts[self._turn]
        if self._copies:
            self._copies[self._turn].synchronize()  # this buffer's last copy has left it
        host[0] = begin
        host[1:].copy_(negatives.reshape(-1))
        self.slots.copy_(host, non_blocking=self.graph)
        if self._copies:
            self._copies[self._turn].record()
        self._turn = (self._turn + 1) % len(self._hosts)

    def _zero_grad(self) -> None:
        """Gradients cleared before a step (with a GradSync, its buffer zeroed and its views kept)."""
        if self.grad_sync is None:
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.grad_sync.zero_()

    def _on_slots(self) -> torch.Tensor:
        """The step over the slots: what the graph holds (gradients None or zero before)."""
        out = dense_forward(self.runner, self.slots, self.num_events, self._scratch)
        loss = link_loss(out)
        if self.grad_sync is not None:
            self.grad_sync.zero_()
        loss.backward()
        if self.grad_sync is not None:
            self.grad_sync.all_reduce()
        self.optimizer.step()
        out.commit()
        return loss.detach()

    def _warmup(self) -> torch.Tensor:
        """A real step, eager on a side stream (as torch's whole-network capture asks)."""
        current = torch.cuda.current_stream(self.runner.device)
        side = torch.cuda.Stream(self.runner.device)
        side.wait_stream(current)
        self._zero_grad()
        with torch.cuda.stream(side), warnings.catch_warnings():
            # The capturable optimiser warns when it runs outside a capture: here it must, twice.
            warnings.filterwarnings("ignore", message=".*capturable=True.*", category=UserWarning)
            loss = self._on_slots()
        current.wait_stream(side)
        loss.record_stream(current)
        self._warmups += 1
        return loss

    def capture(self) -> None:
        """Captures the step if it is not yet (nothing runs until a replay; the inputs are loaded at each call):
        after its ``warmups`` eager steps. The gradients then live in the graph's pool, or with a GradSync in its
        flat buffer."""
        if self._graph is not None:
            return
        if not self.warmed:
            raise ConfigError(f"a step captured before its {self.warmups} eager warm-up steps, or without a graph")
        if self.grad_sync is not None and not self.grad_sync.attached():
            raise ConfigError("the gradients are no longer views of GradSync's buffer (zero_grad(set_to_none=True)?)")
        self._zero_grad()
        graph = torch.cuda.CUDAGraph()
        self._loss = capture(graph, self._on_slots, self.runner.device)
        self._graph = graph
        self._grads = [(p, p.grad) for group in self.optimizer.param_groups for p in group["params"]]
        log.info(
            "TGN step of %d events captured in a CUDA graph%s",
            self.num_events,
            "" if self.grad_sync is None else ", the gradient all-reduce inside",
        )
