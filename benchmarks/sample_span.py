"""Host time of one GPU-sampled batch, and where it goes (the products-scale GraphSAGE batch: [15,10,5], 1024 seeds).

Calls ``NeighborSampler.sample_blocks`` on a CUDA device batch after batch, as the inline training loop does, on
the synthetic products-scale graph held in this process (``InProcessGraph``: one partition, so every layer is the
local CSC's). Per batch it times the host span (from the call to its return) and the sampling stream's GPU
interval (events), for each combination of:

* the path: ``batch`` (:meth:`distgnn.sampling.gpu.DeviceCSC.sample_blocks` over every layer, one host sync a
  batch), ``one-call`` (the same call a layer: one host sync a layer) or ``two-call`` (sampling, then relabelling:
  two syncs a layer; the path of a layer with remote seeds);
* the GPU: ``idle``, or ``busy`` with a stand-in for the training step queued on the default stream before each
  batch (a CUDA graph of matrix products, ``--step-ms`` of GPU time, replayed once a batch);
* the sampling stream's priority: ``0`` (normal) or ``-1`` (highest, what the loader uses).

Then a cProfile of the host span of the batch and one-call paths at the highest priority (top functions by own
time; a sync shows as the time inside the binding call that waits). Prints a table: host and GPU ms per batch,
median and [p10, p90]. With ``--kernels`` it instead traces the batch and one-call paths (idle GPU, highest
priority) with ``torch.profiler``: per batch, each GPU kernel's and copy's launches and time, their sum against
the host span (what the GPU runs against what the chain takes).

    python3 benchmarks/sample_span.py                       # products scale, on the current GPU
    python3 benchmarks/sample_span.py --num-nodes 200000    # a quick look
    python3 benchmarks/sample_span.py --kernels             # the GPU work of a batch, kernel by kernel
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time
from unittest import mock

import numpy as np
import torch

from distgnn.data import synthetic
from distgnn.sampling import gpu
from distgnn.sampling.neighbor import NeighborSampler
from distgnn.sampling.source import InProcessGraph


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-nodes", type=int, default=2_400_000)
    p.add_argument("--avg-degree", type=float, default=25.8)
    p.add_argument("--fanouts", default="15,10,5")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--batches", type=int, default=200, help="timed batches per setting")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--step-ms", type=float, default=1.4, help="GPU time of the stand-in step (busy)")
    p.add_argument("--top", type=int, default=14, help="functions shown per profile")
    p.add_argument("--kernels", action="store_true", help="trace the GPU kernels of a batch instead")
    return p.parse_args()


def stand_in_step(device: torch.device, step_ms: float) -> torch.cuda.CUDAGraph:
    """A CUDA graph of 1024-square float32 products on the default stream taking about ``step_ms`` on the GPU."""
    a = torch.randn(1024, 1024, device=device)
    b = torch.randn(1024, 1024, device=device)
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        a @ b
    end.record()
    torch.cuda.synchronize()
    count = max(1, round(step_ms / (start.elapsed_time(end) / 20)))
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = a @ b
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        for _ in range(count):
            out = torch.mm(a, b, out=out)
    graph.keep = (a, b, out)
    return graph


def run(sampler, g, batches, stream, step, path: str, profile: cProfile.Profile | None = None) -> tuple[list, list]:
    """Host ms and GPU ms per batch (the sampling stream's events) over ``batches``."""
    host, events = [], []
    patches = []
    if path in ("one-call", "two-call"):
        patches.append(mock.patch.object(gpu, "bounded_batch", lambda *a: False))
    if path == "two-call":
        patches.append(mock.patch.object(gpu, "_samples_all_here", lambda *a: False))
    for patch in patches:
        patch.start()
    try:
        for index, seeds in enumerate(batches):
            if step is not None:
                step.replay()
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            if profile is not None:
                profile.enable()
            with torch.cuda.stream(stream):
                begin.record(stream)
                sampler.sample_blocks(g, seeds, index)
                end.record(stream)
            if profile is not None:
                profile.disable()
            host.append((time.perf_counter() - t0) * 1e3)
            events.append((begin, end))
            torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
    finally:
        for patch in patches:
            patch.stop()
    return host, [b.elapsed_time(e) for b, e in events]


def kernel_table(sampler, g, batches, stream, path: str) -> None:
    """One path, idle GPU, traced by torch.profiler: per batch, each kernel's (and copy's) count and GPU time."""
    from torch.profiler import ProfilerActivity, profile

    host, gpu_ms = run(sampler, g, batches, stream, None, path)  # timed without the profiler
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run(sampler, g, batches, stream, None, path)
    n = len(batches)
    totals: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            entry = totals.setdefault(event.name, [0, 0.0])
            entry[0] += 1
            entry[1] += event.time_range.elapsed_us()
    rows = [(name, count / n, us / n) for name, (count, us) in totals.items()]
    rows.sort(key=lambda r: -r[2])
    print(
        f"\n{path}: GPU work of a batch ({n} batches); without the profiler: host span {spread(host)} ms, sampling stream's"
    )
    print(f"interval {spread(gpu_ms)} ms")
    print(f"{'kernel or copy':<70} {'per batch':>9} {'us a batch':>10}")
    for key, count, us in rows:
        print(f"{key[:70]:<70} {count:9.1f} {us:10.1f}")
    print(f"{'all':<70} {sum(r[1] for r in rows):9.1f} {sum(r[2] for r in rows):10.1f}")


def spread(values: list[float]) -> str:
    q = np.percentile(values, [10, 90])
    return f"{statistics.median(values):7.3f} [{q[0]:6.3f}, {q[1]:6.3f}]"


def main() -> None:
    args = parse_args()
    device = torch.device("cuda", torch.cuda.current_device())
    t = time.perf_counter()
    graph = synthetic(args.num_nodes, args.avg_degree, feat_dim=1, num_classes=2)
    g = InProcessGraph(graph)
    print(f"graph: {graph.num_nodes:,} nodes, {graph.num_edges:,} edges ({time.perf_counter() - t:.1f} s)", flush=True)
    fanouts = [int(f) for f in args.fanouts.split(",")]
    sampler = NeighborSampler(fanouts, device=device)
    rng = np.random.default_rng(0)
    order = rng.permutation(args.num_nodes)
    total = args.warmup + args.batches
    batches = [order[i * args.batch_size : (i + 1) * args.batch_size] for i in range(total)]
    step = stand_in_step(device, args.step_ms)
    streams = {0: torch.cuda.Stream(device), -1: torch.cuda.Stream(device, priority=-1)}
    print(f"stream priorities {torch.cuda.Stream.priority_range()}; device {torch.cuda.get_device_name(device)}")
    if args.kernels:
        for path in ("batch", "one-call"):
            run(sampler, g, batches[: args.warmup], streams[-1], None, path)
            kernel_table(sampler, g, batches[args.warmup :], streams[-1], path)
        sampler.close()
        return
    rows = []
    for path in ("batch", "one-call", "two-call"):
        for load in ("idle", "busy"):
            for priority in (0, -1):
                sample = step if load == "busy" else None
                run(sampler, g, batches[: args.warmup], streams[priority], sample, path)
                host, gpu_ms = run(sampler, g, batches[args.warmup :], streams[priority], sample, path)
                rows.append((path, load, priority, host, gpu_ms))
    print(f"\n{'path':>8} {'GPU':>5} {'prio':>4} {'host ms [p10, p90]':>25} {'sampling GPU ms [p10, p90]':>27}")
    for path, load, priority, host, gpu_ms in rows:
        print(f"{path:>8} {load:>5} {priority:4d} {spread(host):>25} {spread(gpu_ms):>27}")
    for path, priority in (("batch", -1), ("one-call", -1)):
        profile = cProfile.Profile()
        run(sampler, g, batches[args.warmup :], streams[priority], step, path, profile)
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(args.top)
        lines = [line for line in text.getvalue().splitlines() if line.strip()]
        print(f"\nprofile: {path}, busy, priority {priority}, {args.batches} batches (own time, s)")
        start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls"))
        print("\n".join(lines[start : start + args.top + 1]))
    sampler.close()


if __name__ == "__main__":
    main()
