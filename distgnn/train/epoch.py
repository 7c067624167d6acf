"""Epoch accounting for training loops: where each epoch's time went, its loss, and the run's RESULT fields.

:class:`EpochMeter` walks one epoch's batches and times each step's stages on the host clock (CUDA events
for the compute on a GPU, read once at the end of the epoch, or exact host times with ``sync_timing``);
loss and accuracy add up on the device, so no step waits for the GPU. :meth:`EpochMeter.finish` reduces
across trainers (sums of loss, samples and edges; the slowest trainer's times) into an
:class:`EpochSummary`, and :class:`TrainingLog` turns the epochs into the fields of the RESULT line.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from tqdm import tqdm

from distgnn.errors import InputError
from distgnn.train.allocator import StepCollector
from distgnn.train.result import epoch_time_s
from distgnn.train.timeline import Timeline


def all_reduce(values: list[float], op: str = "sum") -> list[float]:
    """``op`` ("sum" or "max") of each value across the job's trainers (float64, over gloo); identity in a
    single process."""
    t = torch.tensor(values, dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op])
    return t.tolist()


@dataclass
class EpochSummary:
    """One epoch over all trainers.

    Attributes:
        loss: mean loss per sample; accuracy: correct / samples, or None when the loop counted none.
        time_s, sample_s, fetch_s, compute_s, wait_s: the slowest trainer's seconds (each stage's maximum
            separately): the whole epoch, sampling, feature fetch, compute, and time blocked on batches.
        forward_s, backward_s, optimizer_s: the slowest trainer's compute split by :meth:`EpochMeter.mark`
            (host clock): up to the "forward" mark, from it to the "backward" mark, the rest of the step (all
            zero when the loop marks nothing).
        edges_per_s: sampled edges of all trainers per second of ``time_s``.
        cache_hits, cache_lookups, cache_peer_hits: summed over trainers; None without a cache.
    """

    epoch: int
    loss: float
    accuracy: float | None
    time_s: float
    sample_s: float
    fetch_s: float
    compute_s: float
    wait_s: float
    edges_per_s: float
    cache_hits: float | None = None
    cache_lookups: float | None = None
    cache_peer_hits: float | None = None
    forward_s: float = 0.0
    backward_s: float = 0.0
    optimizer_s: float = 0.0

    @property
    def stage_times(self) -> list[float]:
        return [self.sample_s, self.fetch_s, self.compute_s, self.wait_s]

    @property
    def stage_split(self) -> list[float]:
        """[sample, fetch, forward, backward, optimizer, waited for batches] seconds."""
        return [self.sample_s, self.fetch_s, self.forward_s, self.backward_s, self.optimizer_s, self.wait_s]

    def line(self) -> str:
        """``epoch   3 | loss 0.4321 | train acc 0.8800 | time 1.20s (sample ...) | 123 sampled edges/s``."""
        acc = "" if self.accuracy is None else f" | train acc {self.accuracy:.4f}"
        cache = ""
        if self.cache_lookups is not None:
            cache = f" | cache hit {self.cache_hits / max(self.cache_lookups, 1):.1%}"
        return (
            f"epoch {self.epoch:3d} | loss {self.loss:.4f}{acc} | time {self.time_s:.2f}s (sample {self.sample_s:.2f}s, "
            f"fetch {self.fetch_s:.2f}s, compute {self.compute_s:.2f}s, waited for batches {self.wait_s:.2f}s) | "
            f"{self.edges_per_s:,.0f} sampled edges/s{cache}"
        )


class EpochMeter:
    """The clocks and running sums of one epoch on one trainer.

    Use::

        meter = EpochMeter(epoch, num_batches, device, show_progress=trainer.show_progress)
        for batch, x, y in meter.steps(loader, inputs):   # inputs(item) -> (batch, x, y)
            loss = ...
            meter.mark("forward")                           # optional: splits the compute
            loss.backward()
            meter.mark("backward")
            optimizer.step()
            meter.step_done(loss, len(batch[1]), num_edges, correct)
        summary = meter.finish(cache)

    Args:
        epoch: its number (for the progress bar and the summary).
        num_batches: steps to take (the loader may hold more: the rest is dropped with its iterator).
        device: where loss and counts add up; CUDA events time the compute on a GPU.
        sync_timing: on a GPU, wait for it after the inputs and after the compute, so the stages add up.
        show_progress: draw a tqdm bar on stderr.
        timeline: records each step's spans there (:mod:`distgnn.train.timeline`): ``wait`` (asking the loader for the
            batch: inline sampling, or blocked on the prefetch thread), ``fetch`` (``inputs``) and ``compute``
            (from the yield to :meth:`step_done`).
        gc_every: during :meth:`steps`, Python's garbage collector runs every ``gc_every`` steps and not on its own
            (:class:`~distgnn.train.allocator.StepCollector`); 0 leaves it alone.
    """

    def __init__(
        self,
        epoch: int,
        num_batches: int,
        device: torch.device,
        *,
        sync_timing: bool = False,
        show_progress: bool = False,
        timeline: Timeline | None = None,
        gc_every: int = 0,
    ) -> None:
        self.epoch = epoch
        self._collector = StepCollector(gc_every)
        self.timeline = timeline
        self._compute_span: Any = None
        self.num_batches = num_batches
        self.device = torch.device(device)
        self.sync_timing = sync_timing and self.device.type == "cuda"
        self._progress = tqdm(
            total=num_batches, desc=f"epoch {epoch:3d}", disable=not show_progress or num_batches == 0, leave=False
        )
        self.wait_s = self.sample_s = self.fetch_s = self.compute_s = 0.0
        self.forward_s = self.backward_s = self.optimizer_s = 0.0
        self._t_mark = 0.0
        # On a GPU the compute is asynchronous: host clocks would time its launches.
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._loss = torch.zeros((), dtype=torch.float64, device=self.device)
        self._correct = torch.zeros((), dtype=torch.int64, device=self.device)
        self._counted_correct = False
        self.samples = self.edges = 0.0
        self._start = self._t0 = self._t2 = 0.0

    def steps(self, batches: Iterable[Any], inputs: Callable[[Any], tuple[Any, Any, Any]]) -> Iterator[tuple]:
        """Yields ``inputs(item)`` for the first ``num_batches`` items of ``batches``: ``(batch, x, y)``, where
        ``batch`` is a MiniBatch (its ``timing`` says what sampling and fetching cost in the background).

        "wait" is the time from asking for a batch to its inputs being ready (blocked on the loader, plus any
        fetch left to ``inputs``); "fetch" is the loader's fetch plus the time ``inputs`` took.
        """
        self._collector.start()  # before the clock: a process's first start freezes what exists (set-up)
        self._start = time.perf_counter()
        try:
            yield from self._steps(batches, inputs)
        finally:
            self._collector.stop()

    def _steps(self, batches: Iterable[Any], inputs: Callable[[Any], tuple[Any, Any, Any]]) -> Iterator[tuple]:
        source = iter(batches)
        timeline = self.timeline
        for step in range(self.num_batches):
            if timeline is not None:
                timeline.begin_batch(self.epoch, step)
                span = timeline.open_span("wait")
            self._t0 = time.perf_counter()
            item = next(source)
            t1 = time.perf_counter()
            if timeline is not None:
                timeline.close_span(span)
                span = timeline.open_span("fetch")
            batch, x, y = inputs(item)
            if self.sync_timing:
                torch.cuda.synchronize(self.device)
            self._t2 = self._t_mark = time.perf_counter()
            if timeline is not None:
                timeline.close_span(span)
                self._compute_span = timeline.open_span("compute")
            self.wait_s += self._t2 - self._t0
            self.sample_s += batch.timing["sample"]
            self.fetch_s += batch.timing["fetch"] + (self._t2 - t1)
            if self.device.type == "cuda":
                self._events.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
                self._events[-1][0].record()
            yield batch, x, y
        del source  # an epoch cut short: the loader cancels the rest

    def mark(self, stage: str) -> None:
        """Ends the step's ``stage`` ("forward": from the inputs to the loss; "backward": from there through
        ``loss.backward()``); what follows up to :meth:`step_done` counts as the optimizer's. Host clock (with
        ``sync_timing`` on a GPU, after waiting for it)."""
        if stage not in ("forward", "backward"):
            raise InputError(f"EpochMeter.mark: expected stage 'forward' or 'backward', got {stage!r}")
        if self.sync_timing:
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        if stage == "forward":
            self.forward_s += now - self._t_mark
        else:
            self.backward_s += now - self._t_mark
        self._t_mark = now

    def step_done(self, loss: torch.Tensor, count: int, edges: int, correct: torch.Tensor | None = None) -> None:
        """After the optimizer step: ``loss`` the batch's mean loss (a 0-d tensor), ``count`` its samples,
        ``edges`` the edges of its blocks, ``correct`` a 0-d int tensor of right predictions (or None)."""
        if self._events:
            self._events[-1][1].record()
            if self.sync_timing:
                torch.cuda.synchronize(self.device)
        if self._compute_span is not None:
            self.timeline.close_span(self._compute_span)
            self._compute_span = None
        now = time.perf_counter()
        self.compute_s += now - self._t2
        if self._t_mark > self._t2:  # the loop marked its stages: the rest is the optimizer's
            self.optimizer_s += now - self._t_mark
        self._loss += loss.detach() * count
        if correct is not None:
            self._correct += correct
            self._counted_correct = True
        self.samples += count
        self.edges += edges
        self._progress.update(1)
        self._collector.step_done()

    def finish(self, cache: Any = None) -> EpochSummary:
        """Reduce across trainers (a collective: every trainer calls it). ``cache``: a CachedFeature whose hit
        counts join the summary and are then reset."""
        self._progress.close()
        self._collector.stop()
        if self._events:
            torch.cuda.synchronize(self.device)
            self.compute_s = sum(begin.elapsed_time(end) for begin, end in self._events) / 1e3
        elapsed = time.perf_counter() - self._start
        loss, correct, samples, edges = all_reduce([float(self._loss), float(self._correct), self.samples, self.edges])
        split = [self.forward_s, self.backward_s, self.optimizer_s]
        slowest = all_reduce([elapsed, self.sample_s, self.fetch_s, self.compute_s, self.wait_s, *split], "max")
        summary = EpochSummary(
            self.epoch,
            loss / max(samples, 1),
            correct / max(samples, 1) if self._counted_correct else None,
            *slowest[:5],
            edges_per_s=edges / slowest[0] if slowest[0] > 0 else 0.0,
            forward_s=slowest[5],
            backward_s=slowest[6],
            optimizer_s=slowest[7],
        )
        if cache is not None:
            summary.cache_hits, summary.cache_lookups, summary.cache_peer_hits = all_reduce(
                [cache.cache_hits, cache.lookups, cache.peer_hits]
            )
            cache.reset_stats()
        return summary


class TrainingLog:
    """The epochs of a run, as the RESULT fields every example reports."""

    def __init__(self) -> None:
        self.epochs: list[EpochSummary] = []

    def add(self, summary: EpochSummary) -> EpochSummary:
        self.epochs.append(summary)
        return summary

    def result(self) -> dict[str, Any]:
        """``epoch_time_s`` (:func:`~distgnn.train.result.epoch_time_s`: the median after the first epoch),
        ``epoch_times_s``, ``stage_times_s`` (per epoch, the slowest trainer's [sample, fetch, compute, waited
        for batches] seconds), ``stage_split_s`` (per epoch, the slowest trainer's [sample, fetch, forward,
        backward, optimizer, waited for batches] seconds), ``seps`` (median sampled edges/s), ``train_loss``
        (the last epoch's), ``cache_hit_rate`` and ``cache_peer_hit_rate`` (None without a cache)."""
        times = [e.time_s for e in self.epochs]
        lookups = sum(e.cache_lookups or 0.0 for e in self.epochs)
        cached = bool(self.epochs) and self.epochs[0].cache_lookups is not None
        return {
            "epoch_time_s": epoch_time_s(times),
            "epoch_times_s": [round(t, 4) for t in times],
            "stage_times_s": [[round(t, 4) for t in e.stage_times] for e in self.epochs],
            "stage_split_s": [[round(t, 4) for t in e.stage_split] for e in self.epochs],
            "seps": statistics.median(e.edges_per_s for e in self.epochs) if self.epochs else None,
            "train_loss": self.epochs[-1].loss if self.epochs else None,
            "cache_hit_rate": sum(e.cache_hits for e in self.epochs) / lookups if cached and lookups else None,
            "cache_peer_hit_rate": sum(e.cache_peer_hits for e in self.epochs) / lookups
            if cached and lookups
            else None,
        }
