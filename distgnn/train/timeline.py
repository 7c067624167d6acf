"""Per-batch stage timeline of a training loop: where each batch's time goes, so stalls can be seen.

A :class:`Timeline` records, for every batch, spans of named stages (``sample``, ``fetch``, ``compute``,
``wait`` or any other name). Each span has a host interval (``time.perf_counter``) and, on a CUDA device, a GPU
interval from CUDA events recorded on the current stream at the span's ends, read only once, when the records are
asked for (no host sync per batch). Times are milliseconds since the timeline started. The records go to JSON
(one record per batch), optionally beside a ``torch.profiler`` trace (every span is a ``record_function`` range
in it), and :func:`plot_timeline` draws them (matplotlib, imported only there).

    timeline = Timeline(device, trace_path="trace.json")
    for step, batch in enumerate(loader):
        timeline.begin_batch(epoch, step)
        with timeline.span("compute"):
            ...
    timeline.write_json("timeline.json")
    timeline.close()
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from distgnn.errors import ConfigError, InputError

FORMAT_VERSION = 1


@dataclass
class _Span:
    stage: str
    host_begin: float
    host_end: float = float("nan")
    events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None
    range: Any = None  # the profiler's record_function while open


@dataclass
class _Batch:
    epoch: int
    batch: int
    spans: list[_Span] = field(default_factory=list)


class Timeline:
    """Stage spans per batch, timed with CUDA events on a GPU and host clocks everywhere.

    Args:
        device: the training device; on a CUDA device every span also records two CUDA events on the stream
            that is current where the span opens and closes.
        trace_path: where to write a ``torch.profiler`` Chrome trace (CPU and CUDA activity) when
            :meth:`close` is called; None records no trace (profiling slows every launch, so it is opt-in).
        path: where :meth:`write_json` writes when given no path.
    """

    def __init__(
        self, device: torch.device | str, *, trace_path: str | Path | None = None, path: str | Path | None = None
    ) -> None:
        self.device = torch.device(device)
        self.path = Path(path) if path is not None else None
        self._cuda = self.device.type == "cuda"
        self._batches: list[_Batch] = []
        self._origin_host = time.perf_counter()
        self._origin_event: torch.cuda.Event | None = None
        if self._cuda:
            self._origin_event = torch.cuda.Event(enable_timing=True)
            self._origin_event.record(torch.cuda.current_stream(self.device))
        self._trace_path = Path(trace_path) if trace_path is not None else None
        self._profiler: Any = None
        if self._trace_path is not None:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self._cuda else [])
            self._profiler = profile(activities=activities)
            self._profiler.__enter__()

    def begin_batch(self, epoch: int, batch: int) -> None:
        """Starts the record of batch ``batch`` of ``epoch``; later spans belong to it."""
        self._batches.append(_Batch(epoch, batch))

    @contextlib.contextmanager
    def span(self, stage: str) -> Iterator[None]:
        """Times the block as stage ``stage`` of the current batch (host clock; CUDA events on a GPU)."""
        record = self.open_span(stage)
        try:
            yield
        finally:
            self.close_span(record)

    def open_span(self, stage: str) -> _Span:
        """Starts stage ``stage`` of the current batch; pass the result to :meth:`close_span` (for loops where a
        ``with`` block does not fit, such as a span that ends in another method)."""
        if not self._batches:
            raise InputError(f"span {stage!r} opened before any begin_batch(); call begin_batch(epoch, batch) first")
        record = _Span(stage, time.perf_counter() - self._origin_host)
        if self._cuda:
            record.events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            record.events[0].record(torch.cuda.current_stream(self.device))
        if self._profiler is not None:
            record.range = torch.profiler.record_function(f"distgnn.{stage}")
            record.range.__enter__()
        self._batches[-1].spans.append(record)
        return record

    def close_span(self, record: _Span) -> None:
        """Ends a span :meth:`open_span` started."""
        if record.range is not None:
            record.range.__exit__(None, None, None)
            record.range = None
        if record.events is not None:
            record.events[1].record(torch.cuda.current_stream(self.device))
        record.host_end = time.perf_counter() - self._origin_host

    def add_span(self, stage: str, host_begin: float, host_end: float) -> None:
        """Adds a span measured elsewhere (``time.perf_counter`` values, e.g. a loader thread's) to the current
        batch, with no GPU interval."""
        if not self._batches:
            raise InputError(f"span {stage!r} added before any begin_batch(); call begin_batch(epoch, batch) first")
        self._batches[-1].spans.append(_Span(stage, host_begin - self._origin_host, host_end - self._origin_host))

    def records(self) -> list[dict]:
        """One dict per batch: ``{"epoch", "batch", "spans": [{"stage", "host_ms": [b, e], "gpu_ms": [b, e] or
        None}]}``, milliseconds since the timeline started. Waits for the GPU once (to read the events)."""
        if self._cuda and self._batches:
            torch.cuda.synchronize(self.device)
        out = []
        for batch in self._batches:
            spans = []
            for span in batch.spans:
                gpu = None
                if span.events is not None and self._origin_event is not None:
                    gpu = [round(self._origin_event.elapsed_time(event), 4) for event in span.events]
                host = [round(span.host_begin * 1e3, 4), round(span.host_end * 1e3, 4)]
                spans.append({"stage": span.stage, "host_ms": host, "gpu_ms": gpu})
            out.append({"epoch": batch.epoch, "batch": batch.batch, "spans": spans})
        return out

    def summary(self) -> dict[str, dict[str, float]]:
        """:func:`summarize` of this timeline's records."""
        return summarize(self.records())

    def write_json(self, path: str | Path | None = None, **meta: Any) -> None:
        """Writes ``{"format_version", "device", "meta", "batches": records()}`` to ``path`` (default: the
        timeline's ``path``). ``meta`` gets ``origin_s``, the host clock (``time.perf_counter``, one clock for every
        process of a host) at which the timeline's milliseconds start, so several trainers' timelines line up."""
        path = path if path is not None else self.path
        if path is None:
            raise ConfigError("Timeline.write_json: no path given and the timeline has none")
        meta = {**meta, "origin_s": self._origin_host}
        document = {"format_version": FORMAT_VERSION, "device": str(self.device), "meta": meta}
        document["batches"] = self.records()
        Path(path).write_text(json.dumps(document, indent=None, separators=(",", ":")))

    def close(self) -> None:
        """Stops the profiler (if any) and writes its trace; safe to call twice."""
        if self._profiler is None:
            return
        profiler, self._profiler = self._profiler, None
        profiler.__exit__(None, None, None)
        profiler.export_chrome_trace(str(self._trace_path))

    def __enter__(self) -> Timeline:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def add_timeline_args(parser: argparse.ArgumentParser) -> None:
    """``--timeline PATH`` (rank 0's per-batch stage spans as JSON) and ``--trace PATH`` (with it, a
    ``torch.profiler`` Chrome trace of the run, which slows every launch)."""
    group = parser.add_argument_group("timeline")
    group.add_argument(
        "--timeline",
        help="write each trainer's per-batch stage spans (sample, fetch, compute) as JSON: rank 0's to PATH, rank\n"
        "r's beside it with -rank<r> before the suffix",
    )
    group.add_argument("--trace", help="with --timeline: also a torch.profiler Chrome trace of rank 0 to PATH")


def rank_path(path: str | Path, rank: int) -> Path:
    """``path`` for rank 0, else ``path`` with ``-rank<rank>`` before its suffix (``t.json`` -> ``t-rank1.json``)."""
    path = Path(path)
    return path if rank == 0 else path.with_name(f"{path.stem}-rank{rank}{path.suffix}")


def timeline_from_args(args: argparse.Namespace, device: torch.device, rank: int) -> Timeline | None:
    """The Timeline ``--timeline`` asks for, writing to :func:`rank_path` of it (with ``--trace``, rank 0's also
    records the profiler trace); None without the flag.

    Raises:
        ConfigError: ``--trace`` without ``--timeline``.
    """
    if getattr(args, "trace", None) and not getattr(args, "timeline", None):
        raise ConfigError("--trace needs --timeline PATH (the trace's ranges are the timeline's spans)")
    if not getattr(args, "timeline", None):
        return None
    return Timeline(device, trace_path=args.trace if rank == 0 else None, path=rank_path(args.timeline, rank))


def summarize(batches: list[dict], epochs: set[int] | None = None) -> dict[str, dict[str, float]]:
    """Per stage, over the batches of ``epochs`` (all when None): ``count``, total ``host_ms`` and ``gpu_ms`` (NaN
    where no span has GPU intervals). Under the key ``"all"``: ``wall_ms`` from the first span's begin to the last
    one's end (host clock) and ``gpu_busy_ms``, the length of the union of every GPU interval: where it falls short
    of the wall time, the GPU ran none of the recorded stages (a stall)."""
    totals: dict[str, dict[str, float]] = {}
    host_edges: list[float] = []
    gpu_intervals: list[list[float]] = []
    for record in batches:
        if epochs is not None and record["epoch"] not in epochs:
            continue
        for span in record["spans"]:
            total = totals.setdefault(span["stage"], {"count": 0, "host_ms": 0.0, "gpu_ms": float("nan")})
            total["count"] += 1
            total["host_ms"] += span["host_ms"][1] - span["host_ms"][0]
            host_edges += span["host_ms"]
            if span["gpu_ms"] is not None:
                gpu_ms = span["gpu_ms"][1] - span["gpu_ms"][0]
                total["gpu_ms"] = gpu_ms if total["gpu_ms"] != total["gpu_ms"] else total["gpu_ms"] + gpu_ms
                gpu_intervals.append(span["gpu_ms"])
    busy, reach = 0.0, float("-inf")
    for begin, end in sorted(gpu_intervals):
        busy += max(0.0, end - max(begin, reach))
        reach = max(reach, end)
    wall = max(host_edges) - min(host_edges) if host_edges else 0.0
    totals["all"] = {"wall_ms": wall, "gpu_busy_ms": busy if gpu_intervals else float("nan")}
    return totals


def read_timeline(path: str | Path) -> dict:
    """The document :meth:`Timeline.write_json` wrote.

    Raises:
        InputError: the file is not a timeline of a version this code reads.
    """
    document = json.loads(Path(path).read_text())
    if not isinstance(document, dict) or document.get("format_version") != FORMAT_VERSION:
        raise InputError(
            f"{path} is not a distgnn timeline of format_version {FORMAT_VERSION}; write it with Timeline.write_json"
        )
    return document


def timeline_panels(document: dict, clock: str = "auto") -> dict:
    """What :func:`plot_timeline` draws, as data: ``use_gpu`` (the clock used), ``stages`` (in first-seen
    order), ``lanes`` (per stage, every span as ``(begin_ms, length_ms)``), ``per_batch`` (per stage, its
    milliseconds in each batch) and ``ylim`` (the per-batch panel's top: 3x the 99th percentile, so warm-up
    batches do not flatten the rest; None without spans).

    Raises:
        InputError: ``clock`` is not ``"auto"``, ``"gpu"`` or ``"host"``.
    """
    if clock not in ("auto", "gpu", "host"):
        raise InputError(f"clock must be 'auto', 'gpu' or 'host', got {clock!r}")
    batches = document["batches"]
    has_gpu = any(span["gpu_ms"] is not None for record in batches for span in record["spans"])
    use_gpu = clock == "gpu" or (clock == "auto" and has_gpu)
    stages = list(dict.fromkeys(span["stage"] for record in batches for span in record["spans"]))

    def interval(span: dict) -> list[float]:
        return span["gpu_ms"] if use_gpu and span["gpu_ms"] is not None else span["host_ms"]

    lanes = {
        stage: [
            (begin, end - begin)
            for record in batches
            for span in record["spans"]
            if span["stage"] == stage
            for begin, end in [interval(span)]
        ]
        for stage in stages
    }
    per_batch = {
        stage: [
            sum(interval(s)[1] - interval(s)[0] for s in record["spans"] if s["stage"] == stage) for record in batches
        ]
        for stage in stages
    }
    every = sorted(ms for ys in per_batch.values() for ms in ys)
    ylim = (3 * every[min(len(every) - 1, int(0.99 * len(every)))] or None) if every else None
    return {"use_gpu": use_gpu, "stages": stages, "lanes": lanes, "per_batch": per_batch, "ylim": ylim}


def plot_timeline(document: dict, path: str | Path, *, clock: str = "auto") -> None:
    """Draws a timeline document: the top panel places every span on the time axis (one lane per stage, so gaps
    are stalls), the bottom panel plots each stage's milliseconds per batch (:func:`timeline_panels` gives
    the data).

    Args:
        document: what :func:`read_timeline` returns (or the same dict built in memory).
        path: image file to write (the suffix picks the format: .png, .svg, .pdf).
        clock: ``"gpu"`` (CUDA event intervals; spans without them fall back to the host's), ``"host"``, or
            ``"auto"`` (gpu when the document has GPU intervals).

    Raises:
        ConfigError: matplotlib is not installed (``pip install matplotlib``).
    """
    panels = timeline_panels(document, clock)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ConfigError("plotting a timeline needs matplotlib: pip install matplotlib") from exc
    stages = panels["stages"]
    colors = {stage: plt.get_cmap("tab10")(k % 10) for k, stage in enumerate(stages)}
    figure, (lanes, per_batch) = plt.subplots(2, 1, figsize=(12, 6), gridspec_kw={"height_ratios": [1, 1.4]})
    for lane, stage in enumerate(stages):
        lanes.broken_barh(panels["lanes"][stage], (lane - 0.4, 0.8), facecolors=colors[stage])
    lanes.set_yticks(range(len(stages)), stages)
    lanes.set_xlabel(f"ms since start ({'GPU events' if panels['use_gpu'] else 'host clock'})")
    lanes.set_title("stage spans (gaps in a lane are time that stage was not running)")
    for stage in stages:
        ys = panels["per_batch"][stage]
        per_batch.plot(range(len(ys)), ys, label=stage, color=colors[stage], linewidth=1)
    if panels["ylim"] is not None:
        per_batch.set_ylim(0, panels["ylim"])
    per_batch.set_xlabel("batch (in recorded order)")
    per_batch.set_ylabel("ms")
    per_batch.legend(loc="upper right", ncol=len(stages))
    figure.tight_layout()
    figure.savefig(str(path), dpi=110)
    plt.close(figure)
