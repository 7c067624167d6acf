"""Training and evaluating a TGN on an event stream, chronologically, batch by batch.

:class:`TGNRunner` owns what one memory copy's trainer needs: the stream as tensors, the temporal sampler, the
model and its :class:`~distgnn.nn.temporal.NodeMemory`. A batch is a contiguous run of events:

1. roots (sources, destinations, negatives) sample neighbours strictly before the batch's first event, so a
   prediction sees none of its own batch's events;
2. the batch's distinct nodes read their memory (mail of earlier batches applied by the GRU);
3. the attention layer embeds the roots, the predictor scores the pairs;
4. after the optimizer step, :meth:`BatchOutput.commit` writes the memory read in 2 and stores the batch's
   events as mail.

Evaluation follows PyG's TGN example: each held-out batch against one uniform random destination per event
(from the destination id range), AP and AUC per batch averaged; MRR against 49 random destinations. The
evaluation's negatives come from their own random stream, seeded alike at every evaluation (DistTGL draws its
evaluation negatives once, ahead of training): every evaluation of a run, and of runs with the same seed,
scores the same pairs, and evaluating does not move the training negatives.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from distgnn.data.events import EventStream
from distgnn.errors import ConfigError
from distgnn.nn.temporal import TGN, NodeMemory
from distgnn.temporal.graph import TemporalCSR
from distgnn.temporal.memory_group import MemoryGroup
from distgnn.temporal.parallel import share_of_batch
from distgnn.temporal.sampler import TemporalSampler
from distgnn.temporal.shared import host_tensor
from distgnn.temporal.step import STEP_MODES, WARMUP_STEPS, BatchOutput, DenseStep, graph_unsupported, link_loss
from distgnn.temporal.warm import StreamReplay, replay_memory
from distgnn.train.evaluation import auc, ranks
from distgnn.train.grad_sync import GradSync

MRR_NEGATIVES = 49


def chronological_split(num_events: int, val: float = 0.15, test: float = 0.15) -> tuple[int, int]:
    """``(train_end, val_end)``: events ``[0, train_end)`` train, ``[train_end, val_end)`` validate, the rest test."""
    val_end = int(round(num_events * (1 - test)))
    train_end = int(round(num_events * (1 - test - val)))
    if not 0 < train_end < val_end < num_events:
        raise ConfigError(f"a stream of {num_events} events is too short for a {1 - val - test:.2f}/{val}/{test} split")
    return train_end, val_end


def batch_ranges(start: int, stop: int, batch_size: int) -> list[tuple[int, int]]:
    """Consecutive ``(begin, end)`` event ranges of at most ``batch_size`` covering ``[start, stop)``."""
    return [(b, min(b + batch_size, stop)) for b in range(start, stop, batch_size)]


def average_precision(pos: np.ndarray, neg: np.ndarray) -> float:
    """Average precision of positives ``pos`` against negatives ``neg`` (float arrays of scores); thresholds at
    each distinct score, ties resolved as one step (as scikit-learn's ``average_precision_score``)."""
    scores = np.concatenate([pos, neg])
    labels = np.concatenate([np.ones(len(pos)), np.zeros(len(neg))])
    order = np.argsort(-scores, kind="stable")
    scores, labels = scores[order], labels[order]
    last_of_run = np.r_[np.flatnonzero(np.diff(scores)), len(scores) - 1]
    true_pos = np.cumsum(labels)[last_of_run]
    predicted = last_of_run + 1
    precision = true_pos / predicted
    recall = true_pos / max(len(pos), 1)
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


class TGNRunner:
    """One memory copy's view of the stream: forward passes over event ranges, training, evaluation.

    Args:
        model: the TGN (unwrapped; a DDP wrapper is passed to :meth:`forward` / :meth:`train_batch`).
        events: the whole stream (time-sorted).
        csr: its time-sorted CSR.
        device: where the model, memory and sampler run.
        k: neighbours per root (most recent).
        seed: the training negatives' random stream.
        num_threads: the sampler's CPU threads.
        group: the mini-batch-parallel group whose owner holds the memory copy (None: this runner holds it).
        step: how :meth:`train_batch` trains a batch that one process trains alone: ``"eager"`` (:meth:`forward`
            and autograd), ``"graph"`` (:class:`~distgnn.temporal.step.DenseStep` replayed from a CUDA graph; the
            optimizer made with ``capturable=True``) or ``"auto"`` (the graph where
            :func:`~distgnn.temporal.step.graph_unsupported` allows it). Evaluation is eager in every mode.
        eval_seed: the evaluation negatives' random stream (restarted at every :meth:`evaluate`).
        grad_sync: this trainer's gradients are averaged with other trainers' (memory copies of a job without
            DDP) through this :class:`~distgnn.train.grad_sync.GradSync`: every training step all-reduces its
            flat gradient buffer (inside the CUDA graph with ``step`` graph); every trainer takes as many steps.
        clip_grad_norm: the largest global gradient norm a step applies (larger gradients scaled down to it);
            None: no clipping. The CUDA graph step does not clip (``"auto"`` then trains eagerly).
    """

    def __init__(
        self,
        model: TGN,
        events: EventStream,
        csr: TemporalCSR,
        device: torch.device,
        k: int = 10,
        seed: int = 0,
        num_threads: int | None = None,
        group: MemoryGroup | None = None,
        step: str = "eager",
        eval_seed: int = 0,
        grad_sync: GradSync | None = None,
        clip_grad_norm: float | None = None,
    ):
        if step not in STEP_MODES:
            raise ConfigError(f"step must be one of {STEP_MODES}, got {step!r}")
        self.model, self.device = model, device
        # On the CPU these are the stream's arrays themselves (shared memory in a job), never written.
        self.src = host_tensor(events.src).to(device)
        self.dst = host_tensor(events.dst).to(device)
        self.time = host_tensor(events.time).to(device)
        self.feat = None if events.feat is None else host_tensor(events.feat).to(device)
        self.edge_dim = events.feat_dim
        self.dst_low, self.dst_high = int(events.dst.min()), int(events.dst.max())
        self.sampler = TemporalSampler(csr, k, device=device, num_threads=num_threads)
        self.group = group
        # Without a group the runner holds its memory copy; in a group only the owner does.
        self.memory: NodeMemory | None = group.memory if group is not None else model.new_memory(device)
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        self.eval_seed = eval_seed
        if grad_sync is not None and group is not None:
            raise ConfigError("a runner in a mini-batch-parallel group syncs gradients through DDP, not a GradSync")
        self.grad_sync = grad_sync
        if clip_grad_norm is not None and not clip_grad_norm > 0:
            raise ConfigError(f"the gradient clipping norm must be > 0, got {clip_grad_norm}")
        self.clip_grad_norm = clip_grad_norm
        why_not = graph_unsupported(self) or ("the step clips gradients" if clip_grad_norm is not None else None)
        if step == "graph" and why_not:
            raise ConfigError(f"--step graph cannot run: {why_not}; pass --step eager or --step auto")
        self.graphed = step == "graph" or (step == "auto" and why_not is None)
        self._dense_steps: dict[tuple[int, int], DenseStep] = {}
        self._replays: dict[tuple[int, int], StreamReplay] = {}

    def release_steps(self) -> None:
        """Drops the captured training steps and memory replays (their CUDA graphs), after the GPU has finished
        them. Call it before destroying the process group whose all-reduce a graph holds: NCCL's teardown waits
        forever on a communicator a live graph still uses."""
        if (self._dense_steps or self._replays) and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._dense_steps.clear()
        self._replays.clear()

    def warm_memory(self, stop: int, batch_size: int) -> None:
        """Empties the memory and replays events ``[0, stop)`` through it in chunks of ``batch_size`` with the
        current weights (:class:`~distgnn.temporal.warm.StreamReplay`, planned once per ``(stop, batch_size)``;
        on a GPU captured right after its first run). Nothing on a trainer that does not hold the memory."""
        if self.memory is None:
            return
        if stop == 0:
            self.memory.reset()
            return
        key = (stop, batch_size)
        if key not in self._replays:
            self._replays[key] = StreamReplay(self.src, self.dst, self.time, self.feat, stop, batch_size, self.device)
        self._replays[key].replay(self.model, self.memory)

    def prepare_replays(self, stops: set[int], batch_size: int) -> None:
        """On a GPU: the memory replays of ``stops`` (as :meth:`warm_memory`'s) planned, run once and captured
        now, so that a later epoch replays each from its graph. The memory is left replayed over one of them:
        call it where the memory is about to be warmed. Nothing on the CPU (nothing to capture) or on a trainer
        that does not hold the memory."""
        if self.device.type != "cuda" or self.memory is None:
            return
        for stop in sorted(stops - {0}):
            self.warm_memory(stop, batch_size)

    def prepare_steps(self, optimizer: torch.optim.Optimizer, sizes: set[int]) -> None:
        """With the CUDA graph step: the steps of batches of ``sizes`` events captured now (not run), once a step
        of ``optimizer`` has been captured (its state, cuBLAS's handles and the communicator exist), so that no
        later epoch meets a warm-up or a capture. Nothing otherwise."""
        if self.graphed and self._captured(optimizer):
            for size in sorted(sizes):
                step = self._dense_step(size, optimizer)
                if step.warmed:  # else it warms up at its first batches, as an optimizer's first step does
                    step.capture()

    def _captured(self, optimizer: torch.optim.Optimizer) -> bool:
        return any(step.captured for (_, owner), step in self._dense_steps.items() if owner == id(optimizer))

    def _dense_step(self, size: int, optimizer: torch.optim.Optimizer) -> DenseStep:
        """The captured step of ``size`` events; a further size of an optimizer whose step has been captured
        needs no eager warm-up."""
        key = (size, id(optimizer))
        if key not in self._dense_steps:
            warmups = 0 if self._captured(optimizer) else WARMUP_STEPS
            self._dense_steps[key] = DenseStep(
                self, optimizer, size, graph=True, grad_sync=self.grad_sync, warmups=warmups
            )
        return self._dense_steps[key]

    def negatives(self, count: int, per_event: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """int64 [count, per_event] uniform destinations from the stream's destination id range, drawn from
        ``generator`` (default: the training negatives' stream)."""
        return self.draw_negatives(count, per_event, generator).to(self.device)

    def draw_negatives(self, count: int, per_event: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """:meth:`negatives` on the CPU (the same draw from the same stream)."""
        generator = self.generator if generator is None else generator
        return torch.randint(self.dst_low, self.dst_high + 1, (count, per_event), generator=generator)

    def reset_memory(self) -> None:
        """Back to the stream's start (in a group, the owner resets the copy)."""
        if self.memory is not None:
            self.memory.reset()

    def forward(
        self,
        begin: int,
        end: int,
        negatives: torch.Tensor,
        net: torch.nn.Module | None = None,
        cutoff: int | None = None,
    ) -> BatchOutput:
        """Scores of events ``[begin, end)`` and of their sources against ``negatives`` [B, q].

        Args:
            net: what the batch runs through: the DDP wrapper of the model in a distributed job (so its
                gradient hooks fire), else the model itself (default).
            cutoff: index of the event whose time bounds the sampled neighbours (strictly before it):
                the start of the whole batch when ``[begin, end)`` is one trainer's share of it (default
                ``begin``).
        """
        net = self.model if net is None else net
        src, dst, t = self.src[begin:end], self.dst[begin:end], self.time[begin:end]
        num_events = negatives.shape[0]
        # Each distinct node is embedded once per batch, from events before the batch's cutoff (its start).
        roots, pairs = torch.unique(torch.cat([src, dst, negatives.flatten()]), return_inverse=True)
        cutoff_times = self.time[begin if cutoff is None else cutoff].expand(len(roots)).contiguous()
        hop = self.sampler.sample(roots, cutoff_times)[0]
        filled = torch.where(hop.mask, hop.neighbors, roots.unsqueeze(1))
        nodes, inverse = torch.unique(torch.cat([roots, filled.flatten()]), return_inverse=True)
        if self.feat is not None:
            nbr_feat = self.feat[hop.eids.clamp(min=0)] * hop.mask.unsqueeze(-1)
        else:
            nbr_feat = torch.zeros(*hop.mask.shape, 0, device=self.device)
        root_index = inverse[: len(roots)]
        nbr_index = inverse[len(roots) :].view_as(hop.neighbors)
        if self.group is None:
            memory, memory_index = self.memory, nodes
        else:
            memory, memory_index = self.group.read(nodes), torch.arange(len(nodes))
        pos, neg, memory_rows = net(
            memory,
            memory_index,
            nodes,
            root_index,
            nbr_index,
            hop.times,
            nbr_feat,
            hop.mask,
            pairs,
            num_events,
        )
        event_rows = root_index[pairs[: 2 * num_events]]  # rows of `nodes` holding each source, destination
        feat = None if self.feat is None else self.feat[begin:end]
        group, own = self.group, self.memory

        def commit() -> None:
            rows = memory_rows.detach()
            src_rows, dst_rows = rows[event_rows[:num_events]], rows[event_rows[num_events:]]
            if group is not None:
                group.commit(nodes, rows, src, dst, t, src_rows, dst_rows, feat)
                return
            own.write_memory(nodes, rows)
            own.store_mail(src, dst, t, src_rows, dst_rows, feat)

        return BatchOutput(pos, neg, commit)

    def train_batch(
        self,
        begin: int,
        end: int,
        optimizer: torch.optim.Optimizer,
        net: torch.nn.Module | None = None,
        share: tuple[int, int] = (0, 1),
    ) -> float:
        """One training step on the batch ``[begin, end)`` against one random destination per event; returns
        the loss.

        Args:
            net: as in :meth:`forward`.
            share: ``(s, i)``: this trainer takes the s-th of i contiguous shares of the batch (mini-batch
                parallelism); the negatives are drawn for the whole batch, as one trainer would.
        """
        return float(self.train_step(begin, end, optimizer, net, share))

    def train_step(
        self,
        begin: int,
        end: int,
        optimizer: torch.optim.Optimizer,
        net: torch.nn.Module | None = None,
        share: tuple[int, int] = (0, 1),
    ) -> torch.Tensor:
        """:meth:`train_batch` without waiting for the step: the loss as a 0-d tensor on the device, a copy of
        its own (the next step does not overwrite it)."""
        if self.graphed and share == (0, 1) and (net is None or net is self.model):
            step = self._dense_step(end - begin, optimizer)
            return step(begin, self.draw_negatives(end - begin, 1)).clone()
        negatives = self.negatives(end - begin, 1)
        first, stop = share_of_batch(begin, end, *share)
        out = self.forward(first, stop, negatives[first - begin : stop - begin], net, cutoff=begin)
        loss = link_loss(out)
        if self.grad_sync is None:
            optimizer.zero_grad()
        else:
            self.grad_sync.zero_()
        loss.backward()
        if self.grad_sync is not None:
            self.grad_sync.all_reduce()
        if self.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_grad_norm)
        optimizer.step()
        out.commit()
        return loss.detach()

    @torch.no_grad()
    def evaluate(
        self, ranges: list[tuple[int, int]], mrr: bool = False, catch_up: list[tuple[int, int]] | None = None
    ) -> dict[str, float]:
        """AP and AUC (per batch against one random destination each, averaged) over ``ranges``, and with
        ``mrr`` the mean reciprocal rank against 49 random destinations; the memory moves through them.

        With ``catch_up`` (the event ranges between where the memory stands and ``ranges``, e.g. the training
        events a trainer has not reached yet mid-epoch), a scratch copy of the memory is first moved over them
        by :func:`~distgnn.temporal.warm.replay_memory` (memory only, as a warming copy) and evaluated instead;
        the memory itself stays where it was. Runs on the trainer holding the memory copy (alone, outside its
        group's collectives)."""
        if self.memory is None:
            raise ConfigError("evaluation runs on the trainer that owns the memory copy")
        group, self.group = self.group, None
        memory = self.memory
        if catch_up is not None:
            self.memory = self.model.new_memory(self.device)
            self.memory.load_state(memory.state())
            replay_memory(self.model, self.memory, self.src, self.dst, self.time, self.feat, catch_up)
        try:
            return self._evaluate(ranges, mrr)
        finally:
            self.group, self.memory = group, memory

    def _evaluate(self, ranges: list[tuple[int, int]], mrr: bool) -> dict[str, float]:
        aps, aucs, reciprocal = [], [], []
        # The AP negatives and the MRR negatives come from streams of their own: AP and AUC are the same figures
        # with or without MRR.
        generator = torch.Generator(device="cpu").manual_seed(self.eval_seed)
        ranking = torch.Generator(device="cpu").manual_seed(self.eval_seed + 1)
        for begin, end in ranges:
            negatives = self.negatives(end - begin, 1, generator)
            if mrr:
                negatives = torch.cat([negatives, self.negatives(end - begin, MRR_NEGATIVES, ranking)], 1)
            out = self.forward(begin, end, negatives)
            pos = out.pos.float().cpu()
            first = out.neg[:, 0].float().cpu()
            aps.append(average_precision(pos.numpy(), first.numpy()))
            aucs.append(auc(pos, first))
            if mrr:
                reciprocal.append(1.0 / ranks(pos, out.neg[:, 1:].float().cpu()))
            out.commit()
        result = {"ap": float(np.mean(aps)), "auc": float(np.mean(aucs))}
        if mrr:
            result["mrr"] = float(torch.cat(reciprocal).mean())
        return result


@dataclass
class EpochTiming:
    """Wall time of one epoch's training part and the events it trained on."""

    seconds: float
    events: int

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0


def train_epoch(
    runner: TGNRunner,
    ranges: list[tuple[int, int]],
    optimizer: torch.optim.Optimizer,
    net: torch.nn.Module | None = None,
    on_step: Callable[[int, float], None] | None = None,
    share: tuple[int, int] = (0, 1),
    reset: bool = True,
    lazy_loss: bool = False,
    warmup: int = 0,
) -> tuple[float, EpochTiming]:
    """Trains over ``ranges`` in order, from a reset memory unless ``reset`` is False (a resumed epoch);
    ``net`` and ``share`` as in :meth:`TGNRunner.train_batch`. The first ``warmup`` ranges are not trained:
    their events only move the memory (:func:`~distgnn.temporal.warm.replay_memory`, no gradient, no step),
    so that the first trained batch reads a memory that has seen the stream. Returns the mean loss (of the
    trained batches) and the timing.

    With ``lazy_loss`` the steps' losses stay on the device until the epoch ends (:meth:`TGNRunner.train_step`:
    no wait for the GPU per step) and ``on_step`` gets each as a 0-d tensor; else as a float."""
    if reset:
        runner.reset_memory()
    runner.model.train()
    start = time.perf_counter()
    if warmup > 0:
        if runner.memory is None:
            raise ConfigError("the memory warm-up runs on the trainer that owns the memory copy")
        replay_memory(runner.model, runner.memory, runner.src, runner.dst, runner.time, runner.feat, ranges[:warmup])
        ranges = ranges[warmup:]
    losses = []
    for step, (begin, end) in enumerate(ranges):
        if lazy_loss:
            losses.append(runner.train_step(begin, end, optimizer, net, share))
        else:
            losses.append(runner.train_batch(begin, end, optimizer, net, share))
        if on_step is not None:
            on_step(step, losses[-1])
    if lazy_loss and losses:
        losses = torch.stack(losses).cpu().tolist()
    elapsed = time.perf_counter() - start
    return float(np.mean(losses)) if losses else 0.0, EpochTiming(elapsed, sum(e - b for b, e in ranges))
