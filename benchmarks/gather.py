"""Tiered feature gather on a GPU: GB/s per tier, mixed cache/host path vs CPU gather + copy, hot-set hit rates.

Builds a power-law (Chung-Lu, symmetric) graph and a feature table of ``num_nodes x dim`` in host memory that is
page-locked with cudaHostRegister (as the partition's /dev/shm segment would be), samples GraphSAGE-style
mini-batches on the GPU (uniform neighbours with replacement), and times ``distgnn.cache.gather`` on the
batches' input nodes. Throughput counts gathered feature bytes (rows x row bytes) per second of the whole call
(planning included). Without CUDA it runs the same steps on the CPU reference path (a smoke test; the
figures mean nothing).

    PYTHONPATH=. python3 benchmarks/gather.py --num-nodes 24000000 --dim 128 --json gather.json
    PYTHONPATH=. python3 benchmarks/gather.py --resident     # the all-hit path alone, table on the GPU (A/B)
"""

from __future__ import annotations

import argparse
import importlib
import json
import mmap
import time

import torch

from distgnn.cache import FeatureCache, HostRegistration, HostTier, StagingTier, choose_hot_set, gather
from distgnn.cache.gather import key_space, plan_gather, plan_gather_cuda
from distgnn.native.cuda import gather_kernels


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-nodes", type=int, default=24_000_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="float32")
    parser.add_argument("--avg-degree", type=int, default=10)
    parser.add_argument(
        "--alpha", type=float, default=0.5, help="node weight ~ rank^-alpha (degree exponent 1+1/alpha)"
    )
    parser.add_argument("--train-frac", type=float, default=0.1)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--fanouts", default="15,10,5")
    parser.add_argument("--presample", type=int, default=200, help="batches sampled to count access frequency")
    parser.add_argument("--eval-batches", type=int, default=40, help="fresh batches for hit rates")
    parser.add_argument("--timed", type=int, default=10, help="batches timed per configuration")
    parser.add_argument("--cache-fracs", default="0,0.05,0.1,0.2,0.4")
    parser.add_argument("--cpu-threads", type=int, default=0, help="threads of the CPU baseline (0: all)")
    parser.add_argument(
        "--cpu-shares",
        default="0.25,0.3,0.35,0.4,0.45,0.5,0.6,1",
        help="host-tier fractions gathered by CPU threads + DMA beside the zero-copy kernel (gather's cpu_share)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the figures here as JSON")
    parser.add_argument("--cpu-chunk-mb", type=float, help="bytes per CPU gather + DMA step of cpu_share (MB)")
    parser.add_argument("--hot-first", action="store_true", help="number nodes by expected degree (not shuffled)")
    parser.add_argument(
        "--table-memory",
        choices=["registered", "pinned"],
        default="registered",
        help="host table: an anonymous mapping registered with cudaHostRegister, or torch pinned memory (cudaHostAlloc)",
    )
    parser.add_argument(
        "--strides", help="only measure zero-copy reads of rows 0, s, 2s, ... for each stride s in this list"
    )
    parser.add_argument(
        "--resident",
        action="store_true",
        help="only the all-hit case: the table on the GPU, cached whole; the all-hit path against the planned path, "
        "torch index_select and a device copy of the same bytes, alternated rounds",
    )
    parser.add_argument("--rounds", type=int, default=5, help="alternated rounds of --resident (median)")
    return parser.parse_args()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def power_law_graph(num_nodes: int, avg_degree: int, alpha: float, device: torch.device, hot_first: bool = False):
    """Symmetric Chung-Lu graph in CSC: each edge end picks node i with probability ~ w_i, w = rank^-alpha.

    Ranks are a random permutation of the ids, or the ids themselves with ``hot_first`` (ids ordered by expected
    degree, as a partitioner that numbers each partition's nodes by degree would leave them).
    """
    if hot_first:
        rank = torch.arange(num_nodes, device=device).double() + 1
    else:
        rank = torch.randperm(num_nodes, device=device).double() + 1
    cdf = torch.cumsum(rank.pow(-alpha), 0)
    cdf /= cdf[-1].clone()
    half = num_nodes * avg_degree // 2
    ends = [
        torch.searchsorted(cdf, torch.rand(half, device=device, dtype=torch.float64)).clamp_(max=num_nodes - 1)
        for _ in range(2)
    ]
    del cdf, rank
    src, dst = torch.cat([ends[0], ends[1]]), torch.cat([ends[1], ends[0]])
    del ends
    order = torch.argsort(dst)
    indices = src[order]
    degree = torch.bincount(dst, minlength=num_nodes)
    del src, dst, order
    indptr = torch.zeros(num_nodes + 1, dtype=torch.int64, device=device)
    torch.cumsum(degree, 0, out=indptr[1:])
    return indptr, indices, degree


def sample_input_nodes(indptr, indices, seeds, fanouts):
    """Unique input nodes of a multi-hop uniform neighbour sample (with replacement), in random order."""
    layers, frontier = [seeds], seeds
    for fanout in fanouts:
        start = indptr[frontier]
        degree = indptr[frontier + 1] - start
        keep = degree > 0
        start = start[keep].repeat_interleave(fanout)
        degree = degree[keep].repeat_interleave(fanout)
        picks = start + (torch.rand(start.shape[0], device=start.device) * degree).long()
        frontier = torch.unique(indices[picks])
        layers.append(frontier)
    nodes = torch.unique(torch.cat(layers))
    return nodes[torch.randperm(nodes.shape[0], device=nodes.device)]


def batches_of(train_ids, batch_size, count, indptr, indices, fanouts):
    order = train_ids[torch.randperm(train_ids.shape[0], device=train_ids.device)]
    num = min(count, order.shape[0] // batch_size)
    return [
        sample_input_nodes(indptr, indices, order[i * batch_size : (i + 1) * batch_size], fanouts) for i in range(num)
    ]


def timed_gather(batches, out, device, **tiers):
    """GB/s of gathered bytes and ms per batch over ``batches``, after one untimed pass over them (so the caching
    allocators hold blocks of every size the batches need: the steady state of an epoch)."""
    for ids in batches:
        gather(out[: ids.shape[0]], ids, **tiers)
    sync(device)
    start = time.perf_counter()
    rows = 0
    for ids in batches:
        gather(out[: ids.shape[0]], ids, **tiers)
        rows += ids.shape[0]
    sync(device)
    seconds = time.perf_counter() - start
    row_bytes = out.shape[1] * out.element_size()
    return rows * row_bytes / seconds / 1e9, seconds / len(batches) * 1e3


def host_table(num_nodes, dim, dtype, huge_pages, device):
    """An anonymous mapping of num_nodes x dim, with or without transparent huge pages, registered and filled."""
    nbytes = num_nodes * dim * torch.empty(0, dtype=dtype).element_size()
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buf.madvise(mmap.MADV_HUGEPAGE if huge_pages else mmap.MADV_NOHUGEPAGE)
    table = torch.frombuffer(buf, dtype=dtype).view(num_nodes, dim)
    registration = HostRegistration(table) if device.type == "cuda" else None
    chunk = max(1, (256 << 20) // (dim * table.element_size()))
    for lo in range(0, num_nodes, chunk):
        table[lo : lo + chunk].copy_(torch.randn(min(chunk, num_nodes - lo), dim, device=device).to(dtype))
    return table, buf, registration


def anon_huge_pages_gb():
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1]) / 1e6
    return float("nan")


def kernel_times(batches, out, device, **tiers):
    """GPU microseconds per batch of each kernel/copy a gather launches (torch.profiler), largest first."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for ids in batches:
            gather(out[: ids.shape[0]], ids, **tiers)
        sync(device)
    times = []
    for event in prof.key_averages():
        total = getattr(event, "device_time_total", 0) or getattr(event, "cuda_time_total", 0)
        if total > 0:
            times.append((event.key, total / len(batches)))
    return sorted(times, key=lambda item: -item[1])


def plan_ms(batches, cache, host, device):
    """Planning alone (cache lookup, sort): ms per batch."""
    keys = key_space(cache, host, None)
    planner = plan_gather_cuda if device.type == "cuda" else plan_gather
    sync(device)
    start = time.perf_counter()
    for ids in batches:
        planner(ids, cache, keys)
    sync(device)
    return (time.perf_counter() - start) / len(batches) * 1e3


def cpu_gather_copy(batches, table, out, device, threads):
    """CPU index_select into a pinned buffer, then one host->GPU copy per batch."""
    saved_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    ids_cpu = [ids.cpu() for ids in batches]
    pin = device.type == "cuda"
    staging = torch.empty((max(i.shape[0] for i in ids_cpu), table.shape[1]), dtype=table.dtype, pin_memory=pin)
    torch.index_select(table, 0, ids_cpu[0], out=staging[: ids_cpu[0].shape[0]])
    sync(device)
    start = time.perf_counter()
    rows = 0
    for ids in ids_cpu:
        buf = staging[: ids.shape[0]]
        torch.index_select(table, 0, ids, out=buf)
        out[: ids.shape[0]].copy_(buf, non_blocking=True)
        sync(device)
        rows += ids.shape[0]
    seconds = time.perf_counter() - start
    torch.set_num_threads(saved_threads)
    return rows * table.shape[1] * table.element_size() / seconds / 1e9, seconds / len(ids_cpu) * 1e3


def torch_index_then_copy(batches, table, device):
    """What a plain PyTorch loop (and DistDGL's local pull) does: ``table[ids].to(device)``, default threads."""
    ids_cpu = [ids.cpu() for ids in batches]
    table[ids_cpu[0]].to(device)
    sync(device)
    start = time.perf_counter()
    rows = 0
    for ids in ids_cpu:
        table[ids].to(device)
        sync(device)
        rows += ids.shape[0]
    seconds = time.perf_counter() - start
    return rows * table.shape[1] * table.element_size() / seconds / 1e9, seconds / len(ids_cpu) * 1e3


_SIDE_STREAMS: dict[int, torch.cuda.Stream] = {}
PYTHON_SHARE_STEPS = ("inputs", "plan", "share_range", "event", "kernel launch", "keys sent", "wait for keys")
PYTHON_SHARE_STEPS += ("CPU setup", "CPU loop", "scatter + wait", "final check", "loop's index_select")
PYTHON_SHARE_STEPS += ("loop's copy launches", "whole")


def python_share_gather(out, ids, host, share, steps=None):
    """The CPU share as session 5 ran it in Python (``_gather_cuda`` at commit 39a35bc, host tier only), replayed
    for an A/B against the extension's one-call ``gather_rows_cpu_share``: plan, ``share_range``, an event, the
    zero-copy kernel, the keys to pinned memory on a side stream, then on the host a loop of ``index_select``
    chunks into pinned memory with their copies, the scatter and the final check. With ``steps`` (a dict of
    lists), appends the host microseconds of each step (``PYTHON_SHARE_STEPS``)."""
    gather_module = importlib.import_module("distgnn.cache.gather")  # the package exports a function of that name
    extension = gather_kernels()
    table, device = host.rows, out.device
    chunk = max(1, gather_module._CPU_CHUNK_BYTES // (table.shape[1] * table.element_size()))
    t = [time.perf_counter()]
    ids = gather_module._check_inputs(out, ids, None, host, None)
    extension.device_accessible(table.data_ptr())
    t.append(time.perf_counter())
    plan, _, unplaced = plan_gather_cuda(ids.to(device), None, key_space(None, host, None))
    t.append(time.perf_counter())
    items = extension.share_range(plan.keys, host.start, host.end, share)
    t.append(time.perf_counter())
    keys_ready = torch.cuda.Event()
    keys_ready.record()
    t.append(time.perf_counter())
    args = (plan.keys, plan.order, plan.hit_base, plan.bad_key, True, table, host.start, None, None, [], unplaced)
    extension.gather_rows(out, *args, items)
    t.append(time.perf_counter())
    side = _SIDE_STREAMS.get(device.index)
    if side is None:  # one stream per device for the whole run, as the replayed code kept
        side = _SIDE_STREAMS[device.index] = torch.cuda.Stream(device)
    host_items = torch.empty(2, dtype=torch.int64, pin_memory=True)
    host_keys = torch.empty(plan.keys.shape, dtype=torch.int64, pin_memory=True)
    side.wait_event(keys_ready)
    arrived = torch.cuda.Event()
    with torch.cuda.stream(side):
        host_items.copy_(items, non_blocking=True)
        host_keys.copy_(plan.keys, non_blocking=True)
        arrived.record(side)
    t.append(time.perf_counter())
    arrived.synchronize()
    t.append(time.perf_counter())
    begin, end = host_items.tolist()
    rows = host_keys[begin:end] - host.start
    staged = torch.empty((rows.shape[0], table.shape[1]), dtype=table.dtype, pin_memory=True)
    selecting = copying = 0.0
    with torch.cuda.stream(side):
        landed = torch.empty_like(staged, device=device)
        t.append(time.perf_counter())
        for lo in range(0, rows.shape[0], chunk):
            hi = min(rows.shape[0], lo + chunk)
            a = time.perf_counter()
            torch.index_select(table, 0, rows[lo:hi], out=staged[lo:hi])
            b = time.perf_counter()
            landed[lo:hi].copy_(staged[lo:hi], non_blocking=True)
            selecting, copying = selecting + b - a, copying + time.perf_counter() - b
        t.append(time.perf_counter())
        out.index_copy_(0, plan.order[begin:end], landed)
    torch.cuda.current_stream(device).wait_stream(side)
    t.append(time.perf_counter())
    unplaced.tolist()
    t.append(time.perf_counter())
    if steps is not None:
        values = [(b - a) * 1e6 for a, b in zip(t, t[1:], strict=False)]
        values += [selecting * 1e6, copying * 1e6, (t[-1] - t[0]) * 1e6]
        for name, value in zip(PYTHON_SHARE_STEPS, values, strict=True):
            steps.setdefault(name, []).append(value)
    return out


def launch_anatomy(batches, table, device, share, rounds=3):
    """Host microseconds of each step of the Python CPU share (``python_share_gather``), medians over ``rounds``
    x ``batches``: what the host spent before the kernel was queued and before the CPU could start its rows."""
    host = HostTier(table, 0)
    steps = {}
    for ids in batches * rounds:
        out = torch.empty((ids.shape[0], table.shape[1]), dtype=table.dtype, device=device)
        sync(device)
        python_share_gather(out, ids, host, share, steps)
    return {name: sorted(v)[len(v) // 2] for name, v in steps.items()}


SHARE_MARKS = ("keys copy queued", "keys on host", "buffers", "first chunk queued", "last chunk queued", "done")


def share_marks(batches, table, device, share, rounds=3):
    """Host clocks inside the extension's ``gather_rows_cpu_share`` (ms after it was called; medians over
    ``rounds`` x ``batches``), the call ``gather`` makes for a CPU share, replayed with its ``marks``."""
    gather_module = importlib.import_module("distgnn.cache.gather")  # the package exports a function of that name
    extension = gather_kernels()
    host = HostTier(table, 0)
    chunk = max(1, gather_module._CPU_CHUNK_BYTES // (table.shape[1] * table.element_size()))
    marks = torch.zeros(len(SHARE_MARKS), dtype=torch.float64)
    seen = {name: [] for name in SHARE_MARKS}
    for ids in batches * rounds:
        out = torch.empty((ids.shape[0], table.shape[1]), dtype=table.dtype, device=device)
        plan, _, unplaced = plan_gather_cuda(ids, None, key_space(None, host, None))
        sync(device)
        marks.zero_()
        args = (plan.keys, plan.order, plan.hit_base, plan.bad_key, table, host.start, None, None, [], unplaced)
        extension.gather_rows_cpu_share(out, *args, share, chunk, marks)
        sync(device)
        for name, value in zip(SHARE_MARKS, marks.tolist(), strict=True):
            seen[name].append(value * 1e3)
    return {name: sorted(v)[len(v) // 2] for name, v in seen.items()}


def share_ab(batches, out, table, device, shares, rounds=3):
    """GB/s of the host tier's gather with each ``cpu_share``: the extension's one call (``gather``) and the
    Python replay (``python_share_gather``), alternated over ``rounds`` on the same batches; medians."""
    host = HostTier(table, 0)
    row_bytes = table.shape[1] * table.element_size()
    results = {}
    for _ in range(rounds):
        for share in shares:
            gbps = timed_gather(batches, out, device, host=host, cpu_share=share)[0]
            results.setdefault((share, "one C++ call"), []).append(gbps)
            sync(device)
            start = time.perf_counter()
            for ids in batches:
                python_share_gather(out[: ids.shape[0]], ids, host, share)
            sync(device)
            gbps = sum(ids.shape[0] for ids in batches) * row_bytes / (time.perf_counter() - start) / 1e9
            results.setdefault((share, "Python (session 5)"), []).append(gbps)
    return {key: sorted(v)[len(v) // 2] for key, v in results.items()}


def share_anatomy(batches, table, device):
    """Where the time of ``cpu_share=1`` goes, per batch (ms): planning + the keys' trip to the host, the CPU
    row gather alone (one call, and in the DMA-sized chunks), the chunks with their copies, the scatter."""
    gather_module = importlib.import_module("distgnn.cache.gather")  # the package exports a function of that name

    host = HostTier(table, 0)
    chunk = max(1, gather_module._CPU_CHUNK_BYTES // (table.shape[1] * table.element_size()))
    parts = {"plan + keys to host": 0.0, "CPU gather, one call": 0.0, "CPU gather, chunked": 0.0}
    parts.update({"chunks + H2D copies": 0.0, "scatter (index_copy_)": 0.0, "whole gather": 0.0})
    extension = gather_kernels()
    for ids in batches:
        out = torch.empty((ids.shape[0], table.shape[1]), dtype=table.dtype, device=device)
        sync(device)
        t0 = time.perf_counter()
        plan, _, _ = plan_gather_cuda(ids, None, key_space(None, host, None))
        begin, end = extension.share_range(plan.keys, host.start, host.end, 1.0).tolist()
        keys = plan.keys[begin:end].cpu()
        t1 = time.perf_counter()
        staged = torch.empty((keys.shape[0], table.shape[1]), dtype=table.dtype, pin_memory=True)
        torch.index_select(table, 0, keys, out=staged)
        t2 = time.perf_counter()
        for lo in range(0, keys.shape[0], chunk):
            torch.index_select(table, 0, keys[lo : lo + chunk], out=staged[lo : lo + chunk])
        t3 = time.perf_counter()
        landed = torch.empty_like(staged, device=device)
        for lo in range(0, keys.shape[0], chunk):
            torch.index_select(table, 0, keys[lo : lo + chunk], out=staged[lo : lo + chunk])
            landed[lo : lo + chunk].copy_(staged[lo : lo + chunk], non_blocking=True)
        sync(device)
        t4 = time.perf_counter()
        out.index_copy_(0, plan.order[begin:end], landed)
        sync(device)
        t5 = time.perf_counter()
        gather(out, ids, host=host, cpu_share=1.0)
        sync(device)
        t6 = time.perf_counter()
        times = (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5)
        for name, seconds in zip(parts, times, strict=True):
            parts[name] += seconds * 1e3 / len(batches)
    return parts


def contention(batches, table, device, rounds=3):
    """What the zero-copy reads share with the CPU share's two halves: GB/s of each alone, then of both at once
    (the other side working for exactly as long as the queued kernels run), for a CPU gather into pinned memory
    (shares host memory, not the link) and a plain host->GPU copy stream (shares the link and the GPU's reads of
    host memory, little host memory bandwidth). Medians of ``rounds``.
    """
    extension = gather_kernels()
    host = HostTier(table, 0)
    keys = key_space(None, host, None)
    plans = [plan_gather_cuda(ids, None, keys)[0] for ids in batches]
    unplaced = torch.zeros(2, dtype=torch.int64, device=device)
    out = torch.empty((max(ids.shape[0] for ids in batches), table.shape[1]), dtype=table.dtype, device=device)
    ids_cpu = [plan.keys.cpu() for plan in plans]
    staged = torch.empty((out.shape[0], table.shape[1]), dtype=table.dtype, pin_memory=True)
    row_bytes = table.shape[1] * table.element_size()
    gpu_bytes = sum(ids.shape[0] for ids in batches) * row_bytes

    def launch_all():
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for plan in plans:
            n = plan.keys.shape[0]
            extension.gather_rows(
                out[:n], plan.keys, plan.order, plan.hit_base, plan.bad_key, True, table, 0, None, None, [], unplaced
            )
        end.record()
        return start, end

    def cpu_gather(until=None):
        rows, k, began = 0, 0, time.perf_counter()
        while (until is None and k < len(ids_cpu)) or (until is not None and not until.query()):
            ids = ids_cpu[k % len(ids_cpu)]
            torch.index_select(table, 0, ids, out=staged[: ids.shape[0]])
            rows, k = rows + ids.shape[0], k + 1
        return rows * row_bytes / (time.perf_counter() - began) / 1e9

    dense = table[: (256 << 20) // row_bytes]  # 256 MB of registered rows: a plain copy-engine stream
    landed = torch.empty_like(dense, device=device)
    copy_stream = torch.cuda.Stream(device)

    def dma(until=None):
        """Copies 256 MB pieces host->GPU on a side stream (until ``until`` completes); GB/s."""
        copies, began = 0, time.perf_counter()
        with torch.cuda.stream(copy_stream):
            while copies == 0 or (until is not None and not until.query()):
                landed.copy_(dense, non_blocking=True)
                copy_stream.synchronize()
                copies += 1
        return copies * dense.numel() * dense.element_size() / (time.perf_counter() - began) / 1e9

    def beside_kernels(other):
        """(GB/s of the zero-copy kernels, GB/s of ``other``) with ``other`` working until the kernels finish."""
        sync(device)
        start, end = launch_all()
        other_rate = other(until=end)
        sync(device)
        return gpu_bytes / start.elapsed_time(end) / 1e6, other_rate

    sides = (("CPU gather", cpu_gather), ("DMA", dma))
    results = {"zero-copy alone": []}
    for name, _ in sides:
        results.update({f"{name} alone": [], f"zero-copy with {name}": [], f"{name} with zero-copy": []})
    for _ in range(rounds):
        sync(device)
        start, end = launch_all()
        sync(device)
        results["zero-copy alone"].append(gpu_bytes / start.elapsed_time(end) / 1e6)
        for name, other in sides:
            results[f"{name} alone"].append(other())
            kernels, beside = beside_kernels(other)
            results[f"zero-copy with {name}"].append(kernels)
            results[f"{name} with zero-copy"].append(beside)
    return {name: sorted(values)[len(values) // 2] for name, values in results.items()}


def copy_ceiling(table, device):
    """Host->GPU copy bandwidth of a contiguous 2 GiB slice of the registered table (median of 10)."""
    if device.type != "cuda":
        return float("nan")
    rows = min(table.shape[0], (2 << 30) // (table.shape[1] * table.element_size()))
    src = table[:rows]
    dst = torch.empty_like(src, device=device)
    times = []
    for _ in range(11):
        sync(device)
        start = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        sync(device)
        times.append(time.perf_counter() - start)
    return src.numel() * src.element_size() / sorted(times[1:])[5] / 1e9


def host_copy_bandwidth():
    """Host memory bandwidth seen by torch's intra-op threads: GB/s read + written by a copy of 1 GiB between two
    host buffers (median of 5), the budget that the CPU share's gather (read a row, write it), its DMA (read it
    again) and the zero-copy reads share."""
    src = torch.ones(1 << 28)
    dst = torch.empty_like(src)
    times = []
    for _ in range(6):
        start = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start)
    return 2 * src.numel() * src.element_size() / sorted(times[1:])[2] / 1e9


def hit_rate(hot, batches, num_nodes):
    cached = torch.zeros(num_nodes, dtype=torch.bool, device=batches[0].device)
    cached[hot.to(cached.device)] = True
    hits = sum(int(cached[ids].sum()) for ids in batches)
    return hits / sum(ids.shape[0] for ids in batches)


def main() -> None:
    args = parse_args()
    if args.cpu_chunk_mb:
        gather_module = importlib.import_module("distgnn.cache.gather")  # the package exports a function of that name

        gather_module._CPU_CHUNK_BYTES = int(args.cpu_chunk_mb * 1e6)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype)
    fanouts = [int(f) for f in args.fanouts.split(",")]
    fracs = [float(f) for f in args.cache_fracs.split(",")]
    torch.manual_seed(args.seed)
    n, dim = args.num_nodes, args.dim
    row_bytes = dim * torch.empty(0, dtype=dtype).element_size()
    report = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "args": vars(args)}
    print(f"device {report['device']}; table {n} x {dim} {args.dtype} = {n * row_bytes / 1e9:.1f} GB", flush=True)

    t0 = time.perf_counter()
    indptr, indices, degree = power_law_graph(n, args.avg_degree, args.alpha, device, args.hot_first)
    train_ids = torch.randperm(n, device=device)[: int(args.train_frac * n)]
    presampled = (
        [] if args.resident else batches_of(train_ids, args.batch_size, args.presample, indptr, indices, fanouts)
    )
    evaluation = batches_of(train_ids, args.batch_size, args.eval_batches, indptr, indices, fanouts)
    del indptr, indices
    mean_rows = sum(b.shape[0] for b in evaluation) / len(evaluation)
    print(
        f"graph + {len(presampled) + len(evaluation)} sampled batches in {time.perf_counter() - t0:.1f} s; "
        f"{mean_rows:.0f} input rows/batch ({mean_rows * row_bytes / 1e6:.0f} MB)",
        flush=True,
    )

    if args.resident:
        resident_ab(args, device, dtype, evaluation, report)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1)
        return
    t0 = time.perf_counter()
    if args.table_memory == "pinned" and device.type == "cuda":
        table, _buf, registration = torch.empty((n, dim), dtype=dtype, pin_memory=True), None, None
        table.copy_(torch.randn(n, dim, dtype=torch.float16, device=device).to(dtype))
    else:
        table, _buf, registration = host_table(n, dim, dtype, True, device)
    report["anon_huge_pages_gb"] = anon_huge_pages_gb()
    print(
        f"table (THP advised; AnonHugePages {report['anon_huge_pages_gb']:.1f} GB) allocated, registered and "
        f"filled in {time.perf_counter() - t0:.1f} s",
        flush=True,
    )

    try:
        if args.strides:
            stride_scan(args, device, table, evaluation, report)
        else:
            run(args, device, dtype, table, degree, presampled, evaluation, row_bytes, fracs, report)
    finally:
        if registration is not None:
            registration.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


def resident_ab(args, device, dtype, evaluation, report) -> None:
    """The all-hit case on a table held whole on the GPU: GB/s of gathered bytes of whole calls (medians of
    alternated rounds over ``--timed`` batches), all-hit path vs the planned path (lookup, sort, kernel, sync) vs
    ``torch.index_select``, and a device copy of as many contiguous bytes as the ceiling."""
    n, dim = args.num_nodes, args.dim
    table = torch.randn(n, dim, device=device).to(dtype)
    gather_module = importlib.import_module("distgnn.cache.gather")  # the package exports a function of that name
    identity = FeatureCache.replicate(torch.arange(n), table, n, device)
    shuffled_ids = torch.randperm(n, device=device)
    shuffled = FeatureCache.replicate(shuffled_ids, table[shuffled_ids], n, device)
    del shuffled_ids
    timed = evaluation[: args.timed]
    rows = max(ids.shape[0] for ids in timed)
    out = torch.empty((rows, dim), dtype=dtype, device=device)
    src = torch.empty_like(out).copy_(table[:rows])
    for cache in (identity, shuffled):
        check = timed[0]
        assert torch.equal(gather(out[: check.shape[0]], check, cache=cache), table[check]), "wrong rows"

    if device.type == "cuda":

        def planned(o, ids):
            gather_module._gather_cuda(o, ids, identity, None, None, True)
    else:  # a smoke test: the reference stands in

        def planned(o, ids):
            gather_module._gather_reference(o, ids, identity, None, None)

    variants = {
        "all-hit path, identity slots": lambda o, ids: gather(o, ids, cache=identity),
        "all-hit path, shuffled slots": lambda o, ids: gather(o, ids, cache=shuffled),
        "planned path (plan, sort, kernel, sync)": planned,
        "torch.index_select": lambda o, ids: torch.index_select(table, 0, ids, out=o),
        "device copy of the same bytes": lambda o, ids: o.copy_(src[: ids.shape[0]]),
    }
    row_bytes = dim * table.element_size()
    total = sum(ids.shape[0] for ids in timed) * row_bytes
    results: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds + 1):  # the first round warms up (allocator blocks, extension, clocks)
        for name, call in variants.items():
            sync(device)
            start = time.perf_counter()
            for ids in timed:
                call(out[: ids.shape[0]], ids)
            sync(device)
            results[name].append(total / (time.perf_counter() - start) / 1e9)
    identity.check()
    kernel_us = 0.0
    if device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for ids in timed:
                gather(out[: ids.shape[0]], ids, cache=identity)
            sync(device)
        for event in prof.key_averages():
            if "gather_cached_kernel" in event.key:
                kernel_us += (getattr(event, "device_time_total", 0) or getattr(event, "cuda_time_total", 0)) / len(
                    timed
                )
    batch_mb = total / len(timed) / 1e6
    report["resident"] = {"batch_mb": batch_mb, "gbps_rounds": results, "kernel_us": kernel_us}
    planned = sorted(results["planned path (plan, sort, kernel, sync)"][1:])[args.rounds // 2]
    print(f"\nall-hit gather, {batch_mb:.0f} MB batches, GB/s of gathered bytes (median of {args.rounds} rounds)")
    print(f"{'variant':42} {'GB/s':>8} {'vs planned':>10}")
    for name, rates in results.items():
        median = sorted(rates[1:])[args.rounds // 2]
        print(f"{name:42} {median:8.1f} {median / planned:9.2f}x")
    if kernel_us:
        print(f"all-hit kernel alone: {kernel_us:.1f} us per batch = {total / len(timed) / kernel_us / 1e3:.1f} GB/s")


def stride_scan(args, device, table, evaluation, report) -> None:
    """Zero-copy GB/s of the gather kernel reading rows 0, s, 2s, ... (up to a batch's worth, no wrap-around)."""
    n, dim = table.shape
    row_bytes = dim * table.element_size()
    out = torch.empty((max(ids.shape[0] for ids in evaluation), dim), dtype=table.dtype, device=device)
    host = HostTier(table, 0)
    report["strides"] = {}
    times = kernel_times(evaluation[: args.timed], out, device, host=host) if device.type == "cuda" else []
    kernel_us = sum(us for key, us in times if "gather_rows_kernel" in key) or float("nan")
    batch_rows = sum(ids.shape[0] for ids in evaluation[: args.timed]) / args.timed
    report["sampled_batch_kernel_gbps"] = batch_rows * row_bytes / kernel_us / 1e3
    print(f"sampled batches ({args.table_memory} table): kernel {report['sampled_batch_kernel_gbps']:.1f} GB/s")
    print(f"\n{'stride (rows)':>14} {'stride bytes':>13} {'rows':>8} {'kernel GB/s':>12}")
    for stride in (int(s) for s in args.strides.split(",")):
        rows = min(evaluation[0].shape[0], n // stride)
        batches = [torch.arange(rows, device=device) * stride + k % stride for k in range(args.timed)]
        times = kernel_times(batches, out, device, host=host) if device.type == "cuda" else [("gather_rows_kernel", 1)]
        kernel_us = sum(us for key, us in times if "gather_rows_kernel" in key)
        rate = rows * row_bytes / kernel_us / 1e3
        report["strides"][stride] = {"rows": rows, "kernel_gbps": rate}
        print(f"{stride:14d} {stride * row_bytes:13d} {rows:8d} {rate:12.1f}", flush=True)


def run(args, device, dtype, table, degree, presampled, evaluation, row_bytes, fracs, report) -> None:
    n, dim = table.shape
    host = HostTier(table, 0)
    timed = evaluation[: args.timed]
    out = torch.empty((max(b.shape[0] for b in evaluation), dim), dtype=dtype, device=device)

    check = evaluation[0]
    assert torch.equal(gather(out[: check.shape[0]], check, host=host).cpu(), table[check.cpu()]), "wrong rows"

    ceiling = copy_ceiling(table, device)
    report["host_copy_gbps"] = host_copy_bandwidth()
    print(f"host memory copy, {torch.get_num_threads()} threads: {report['host_copy_gbps']:.1f} GB/s read + written")
    tiers = {}
    tiers["host zero-copy, sorted misses"] = timed_gather(timed, out, device, host=host)
    tiers["host zero-copy, unsorted"] = timed_gather(timed, out, device, host=host, sort_misses=False)
    contiguous = [
        torch.arange(k * ids.shape[0], (k + 1) * ids.shape[0], device=device) % n for k, ids in enumerate(timed)
    ]
    tiers["host zero-copy, contiguous ids"] = timed_gather(contiguous, out, device, host=host)
    shares = [float(v) for v in args.cpu_shares.split(",") if v]
    by_share = {0.0: tiers["host zero-copy, sorted misses"]}
    gather_module = importlib.import_module("distgnn.cache.gather")  # the package exports a function of that name

    for share in shares:
        by_share[share] = timed_gather(timed, out, device, host=host, cpu_share=share)
        tiers[f"host, cpu_share {share:g}"] = by_share[share]
        if share in (0.4, 1.0):  # the same with 4 MB DMA chunks (more index_select calls)
            default_chunk = gather_module._CPU_CHUNK_BYTES
            gather_module._CPU_CHUNK_BYTES = 4 << 20
            tiers[f"host, cpu_share {share:g}, 4 MB chunks"] = timed_gather(
                timed, out, device, host=host, cpu_share=share
            )
            gather_module._CPU_CHUNK_BYTES = default_chunk
        got = gather(out[: check.shape[0]], check, host=host, cpu_share=share).cpu()
        assert torch.equal(got, table[check.cpu()]), "wrong rows"
    best_share = max(by_share, key=lambda share: by_share[share][0])
    report["best_cpu_share"] = best_share
    if best_share > 0:
        default_chunk = gather_module._CPU_CHUNK_BYTES
        for chunk_mb in (1, 2, 8):
            gather_module._CPU_CHUNK_BYTES = chunk_mb << 20
            tiers[f"host, cpu_share {best_share:g}, {chunk_mb} MB chunks"] = timed_gather(
                timed, out, device, host=host, cpu_share=best_share
            )
        gather_module._CPU_CHUNK_BYTES = default_chunk
    if device.type == "cuda":
        ab_shares = sorted({0.4, best_share, 0.5, 0.6} - {0.0})
        ab = share_ab(timed, out, table, device, ab_shares)
        report["share_ab_gbps"] = {f"{share:g} {how}": gbps for (share, how), gbps in ab.items()}
        for share in ab_shares:
            print(
                f"cpu_share={share:g} A/B (GB/s, medians of 3 alternated rounds): one C++ call "
                f"{ab[share, 'one C++ call']:.1f}, Python (session 5) {ab[share, 'Python (session 5)']:.1f}"
            )
        report["share_marks_ms"] = {}
        for share in ab_shares:
            marks = report["share_marks_ms"][f"{share:g}"] = share_marks(timed, table, device, share)
            print(
                f"cpu_share={share:g} C++ steps (ms after the call): "
                + "; ".join(f"{k} {v:.3f}" for k, v in marks.items())
            )
        report["launch_anatomy_us"] = {}
        for share in sorted({0.4, best_share} - {0.0}):
            steps = report["launch_anatomy_us"][f"{share:g}"] = launch_anatomy(timed, table, device, share)
            print(f"cpu_share={share:g} host steps (us): " + "; ".join(f"{k} {v:.0f}" for k, v in steps.items()))
        report["share_anatomy_ms"] = share_anatomy(timed, table, device)
        print(
            "cpu_share=1 anatomy (ms/batch): "
            + "; ".join(f"{k} {v:.2f}" for k, v in report["share_anatomy_ms"].items())
        )
    if device.type == "cuda":
        report["contention_gbps"] = contention(timed, table, device)
        print(
            "host memory contention (GB/s): " + "; ".join(f"{k} {v:.1f}" for k, v in report["contention_gbps"].items())
        )
    if device.type == "cuda":
        small, _small_buf, small_registration = host_table(n, dim, dtype, False, device)
        small_host = HostTier(small, 0)
        tiers["host 4 KB pages, sorted misses"] = timed_gather(timed, out, device, host=small_host)
        tiers["host 4 KB pages, unsorted"] = timed_gather(timed, out, device, host=small_host, sort_misses=False)
        small_registration.close()
        del small, small_host, _small_buf
    staged = [StagingTier(torch.sort(ids.cpu()).values, table[torch.sort(ids.cpu()).values]) for ids in timed[:4]]
    if device.type == "cuda":
        staged = [StagingTier(s.ids, s.rows.pin_memory()) for s in staged]
    gbps = []
    for ids, staging in zip(timed[:4], staged, strict=True):
        gbps.append(timed_gather([ids], out, device, staging=staging)[0])
    tiers["staging (pinned remote rows)"] = (sorted(gbps)[len(gbps) // 2], float("nan"))
    del staged
    resident = FeatureCache.replicate(torch.arange(n), table, n, device)
    tiers["GPU-resident (all hits)"] = timed_gather(timed, out, device, cache=resident)
    tiers["planning alone, no cache"] = (float("nan"), plan_ms(timed, None, host, device))
    tiers["planning alone, all cached"] = (float("nan"), plan_ms(timed, resident, host, device))
    configs = [("host zero-copy", {"host": host}), ("GPU-resident", {"cache": resident})]
    if device.type == "cuda" and torch.cuda.device_count() >= 2:
        clique = FeatureCache.clique(torch.arange(n), table, n, [device, torch.device("cuda", 1)])[0]
        tiers["clique of 2, all cached (half on peer)"] = timed_gather(timed, out, device, cache=clique)
        peer_rows = table.to(torch.device("cuda", 1))
        peer_only = FeatureCache([resident.shards[0], peer_rows], torch.arange(n, device=device) * 2 + 1)
        tiers["NVLink peer shard (all hits)"] = timed_gather(timed, out, device, cache=peer_only)
        configs.append(("NVLink peer", {"cache": peer_only}))
    if device.type == "cuda":
        batch_bytes = sum(ids.shape[0] for ids in timed) / len(timed) * row_bytes
        report["kernels"] = {}
        for name, tier_args in configs:
            times = kernel_times(timed, out, device, **tier_args)
            report["kernels"][name] = times
            gather_us = sum(us for key, us in times if "gather_rows_kernel" in key)
            tiers[f"{name}: gather kernel alone"] = (batch_bytes / gather_us / 1e3, gather_us / 1e3)
            print(f"GPU time per batch, {name}: " + "; ".join(f"{key[:60]} {us:.0f} us" for key, us in times[:6]))
    configs.clear()
    clique = peer_only = peer_rows = None
    cpu = cpu_gather_copy(timed, table, out, device, args.cpu_threads)
    tiers[f"CPU gather + copy ({args.cpu_threads or torch.get_num_threads()} threads)"] = cpu
    tiers["CPU gather + copy (1 thread)"] = cpu_gather_copy(timed[:3], table, out, device, 1)
    peer = torch_index_then_copy(timed, table, device)
    tiers["torch table[ids].to(device)"] = peer

    print(f"\nhost->GPU copy ceiling: {ceiling:.1f} GB/s\n")
    print(f"{'tier alone':34} {'GB/s':>8} {'ms/batch':>9}")
    for name, (rate, ms) in tiers.items():
        print(f"{name:34} {rate:8.1f} {ms:9.2f}")
    report["copy_ceiling_gbps"] = ceiling
    report["tiers"] = {name: {"gbps": rate, "ms_per_batch": ms} for name, (rate, ms) in tiers.items()}

    report["mixed"] = []
    print(f"\nmixed path: host rows zero-copy (share 0) and with cpu_share {best_share:g} (best host-only share)")
    print(
        f"{'cached':>7} {'hit freq':>9} {'hit deg':>8} {'GB/s':>8} {'ms/batch':>9} {'GB/s shr':>9} {'ms shr':>7} "
        f"{'vs CPU':>7} {'vs [ids].to':>11}"
    )
    for frac in fracs:
        budget = int(frac * n) * row_bytes
        hot = choose_hot_set(budget, row_bytes, n, samples=presampled)
        by_degree = choose_hot_set(budget, row_bytes, n, in_degree=degree)
        freq_rate = hit_rate(hot, evaluation, n) if hot.numel() else 0.0
        degree_rate = hit_rate(by_degree, evaluation, n) if by_degree.numel() else 0.0
        cache = FeatureCache.replicate(hot, resident.shards[0][hot.to(device)], n, device) if hot.numel() else None
        rate, ms = timed_gather(timed, out, device, cache=cache, host=host)
        shared_rate, shared_ms = timed_gather(timed, out, device, cache=cache, host=host, cpu_share=best_share)
        if cache is not None:
            check = evaluation[-1]
            got = gather(out[: check.shape[0]], check, cache=cache, host=host, cpu_share=best_share).cpu()
            assert torch.equal(got, table[check.cpu()]), "wrong rows"
        row = {"frac": frac, "hit_freq": freq_rate, "hit_degree": degree_rate, "gbps": rate, "ms_per_batch": ms}
        row.update(cpu_share=best_share, gbps_shared=shared_rate, ms_shared=shared_ms)
        best = max(rate, shared_rate)
        row["speedup_vs_cpu"] = best / cpu[0]
        row["speedup_vs_torch_index_copy"] = best / peer[0]
        report["mixed"].append(row)
        print(
            f"{frac:7.0%} {freq_rate:9.1%} {degree_rate:8.1%} {rate:8.1f} {ms:9.2f} {shared_rate:9.1f} "
            f"{shared_ms:7.2f} {best / cpu[0]:6.1f}x {best / peer[0]:10.1f}x",
            flush=True,
        )
        del cache


if __name__ == "__main__":
    main()
