"""Sampled edges per second (SEPS) of the GPU sampler vs the C++ CPU sampler on one power-law graph.

Per mini-batch: ``--batch-size`` distinct random seeds, then for each fanout in ``--fanouts`` (15,10,5: the
seeds get 15, as in Quiver's benchmark) sample the frontier's in-neighbours and make the next frontier from
the frontier and the neighbours: with ``--merge relabel`` (default) by distgnn's per-layer relabel, what its
samplers do to build a block (the C++ relabel on the CPU, the hash-table kernel on the GPU: frontier first,
then new ids in order of first appearance), with ``--merge unique`` by ``unique(frontier ++ neighbours)``
(torch.unique / np.unique, single-threaded on the CPU). SEPS = sampled edges / wall time. "pipeline" times
whole batches (sampling + merge: the sampler as a trainer runs it); "sample only" adds up the sampling calls
alone (GPU: synchronised around each call), and "us/call" is that time per sampling call (one per fanout). Rows: CSC in GPU memory, CSC in pinned host memory read
zero-copy (UVA), and the C++ sampler (distgnn.sampling.cpu) with every CPU core, same graph, same run.

The graph is generated directly with torch (on the GPU when there is one): in-degrees Pareto-distributed
(``--min-degree``, ``--alpha``, capped at ``--max-degree``), sources uniform.

    python benchmarks/sampling_gpu.py [--num-nodes 4000000] [--seconds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch

from distgnn.sampling import cpu, gpu


def power_law_csc(num_nodes, min_degree, alpha, max_degree, index_dtype, device, seed):
    generator = torch.Generator(device=device).manual_seed(seed)
    u = torch.rand(num_nodes, generator=generator, device=device, dtype=torch.float64).clamp_min(1e-12)
    degrees = (min_degree * u.pow(-1.0 / (alpha - 1.0))).floor().clamp_max(max_degree).to(torch.int64)
    indptr = torch.zeros(num_nodes + 1, dtype=torch.int64, device=device)
    torch.cumsum(degrees, 0, out=indptr[1:])
    num_edges = int(indptr[-1])
    indices = torch.randint(0, num_nodes, (num_edges,), generator=generator, device=device, dtype=index_dtype)
    return indptr, indices


def next_frontier(frontier: torch.Tensor, neighbors: torch.Tensor, merge: str) -> torch.Tensor:
    """The next layer's seeds: distgnn's relabel (C++ on CPU tensors, the hash-table kernel on a GPU) or unique."""
    if merge == "relabel":
        return gpu.relabel(frontier, neighbors)[0]
    return torch.unique(torch.cat([frontier, neighbors]))


def run_gpu(indptr, indices, num_nodes, fanouts, batch_size, seconds, device, merge):
    rng_seed = 0

    def batch(timed_calls):
        nonlocal rng_seed
        frontier = torch.randint(0, num_nodes, (batch_size,), device=device).unique()
        edges = 0
        sample_time = 0.0
        for fanout in fanouts:
            rng_seed += 1
            if timed_calls:
                torch.cuda.synchronize(device)
                start = time.perf_counter()
            _, _, neighbors = gpu.sample_neighbors(
                indptr, indices, frontier, fanout, rng_seed=rng_seed, return_neighbors=True
            )
            if timed_calls:
                torch.cuda.synchronize(device)
                sample_time += time.perf_counter() - start
            edges += neighbors.numel()
            frontier = next_frontier(frontier, neighbors, merge)
        return edges, sample_time

    for _ in range(5):
        batch(False)
    return measure(
        lambda: batch(False), lambda: batch(True), seconds, len(fanouts), sync=lambda: torch.cuda.synchronize(device)
    )


def run_cpu(indptr, indices, num_nodes, fanouts, batch_size, seconds, threads, merge):
    rng = np.random.default_rng(0)
    rng_seed = 0

    def batch():
        nonlocal rng_seed
        frontier = np.unique(rng.integers(0, num_nodes, batch_size))
        edges = 0
        sample_time = 0.0
        for fanout in fanouts:
            rng_seed += 1
            start = time.perf_counter()
            _, _, neighbors = cpu.sample_neighbors(
                indptr, indices, frontier, fanout, rng_seed=rng_seed, num_threads=threads, return_neighbors=True
            )
            sample_time += time.perf_counter() - start
            edges += len(neighbors)
            if merge == "relabel":
                frontier = cpu.extension().relabel(frontier, neighbors)[0]
            else:
                frontier = np.unique(np.concatenate([frontier, neighbors]))
        return edges, sample_time

    batch()
    return measure(batch, batch, seconds, len(fanouts), sync=lambda: None)


def measure(untimed_batch, timed_batch, seconds, calls_per_batch, sync):
    """Pipeline SEPS over about `seconds`, then sample-only SEPS over as many batches."""
    sync()
    start = time.perf_counter()
    edges = batches = 0
    while batches < 3 or time.perf_counter() - start < seconds:
        edges += untimed_batch()[0]
        batches += 1
    sync()
    pipeline = time.perf_counter() - start
    sample_edges = sample_time = 0.0
    for _ in range(batches):
        e, t = timed_batch()
        sample_edges += e
        sample_time += t
    return {
        "batches": batches,
        "edges_per_batch": edges / batches,
        "pipeline_seps": edges / pipeline,
        "sample_seps": sample_edges / sample_time,
        "us_per_call": sample_time / (batches * calls_per_batch) * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-nodes", type=int, default=4_000_000)
    parser.add_argument("--min-degree", type=float, default=6.0)
    parser.add_argument("--alpha", type=float, default=2.3)
    parser.add_argument("--max-degree", type=int, default=20_000)
    parser.add_argument("--index-dtype", choices=["int32", "int64"], default="int32")
    parser.add_argument("--fanouts", default="15,10,5")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--seconds", type=float, default=3.0, help="time per row (pipeline pass)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="threads of the C++ sampler")
    parser.add_argument("--merge", choices=("relabel", "unique"), default="relabel", help="next frontier by")
    parser.add_argument("--skip-cpu", action="store_true")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    fanouts = [int(f) for f in args.fanouts.split(",")]
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    index_dtype = getattr(torch, args.index_dtype)

    start = time.perf_counter()
    indptr, indices = power_law_csc(
        args.num_nodes, args.min_degree, args.alpha, args.max_degree, index_dtype, device, seed=0
    )
    num_edges = len(indices)
    print(
        f"graph: {args.num_nodes:,} nodes, {num_edges:,} edges (avg in-degree {num_edges / args.num_nodes:.1f}, "
        f"max {int((indptr[1:] - indptr[:-1]).max())}), {args.index_dtype} indices, "
        f"built on {device} in {time.perf_counter() - start:.1f} s"
    )
    rows = []
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        rows.append(
            (
                "GPU, CSC in GPU memory",
                run_gpu(indptr, indices, args.num_nodes, fanouts, args.batch_size, args.seconds, device, args.merge),
            )
        )
        host_indptr, host_indices = indptr.cpu().pin_memory(), indices.cpu().pin_memory()
        rows.append(
            (
                "GPU, CSC pinned (zero-copy)",
                run_gpu(
                    host_indptr,
                    host_indices,
                    args.num_nodes,
                    fanouts,
                    args.batch_size,
                    args.seconds,
                    device,
                    args.merge,
                ),
            )
        )
        np_indptr, np_indices = host_indptr.numpy(), host_indices.numpy()
    else:
        name = "no GPU"
        np_indptr, np_indices = indptr.numpy(), indices.numpy()
    if not args.skip_cpu:
        cpu_row = run_cpu(
            np_indptr, np_indices, args.num_nodes, fanouts, args.batch_size, args.seconds, args.threads, args.merge
        )
        rows.append((f"C++ sampler, {args.threads} threads", cpu_row))
    base = rows[-1][1] if not args.skip_cpu else None

    print(f"device: {name}; {os.cpu_count()} CPU cores; fanouts {fanouts}, batch {args.batch_size}, merge {args.merge}")
    header = (
        f"| {'sampler':34} | batches | edges/batch | pipeline MSEPS | sample-only MSEPS | us/call "
        "| pipeline vs C++ | sample vs C++ |"
    )
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for label, r in rows:
        ratio_p = f"{r['pipeline_seps'] / base['pipeline_seps']:.1f}x" if base else "-"
        ratio_s = f"{r['sample_seps'] / base['sample_seps']:.1f}x" if base else "-"
        print(
            f"| {label:34} | {r['batches']:7} | {r['edges_per_batch']:11,.0f} | {r['pipeline_seps'] / 1e6:14.1f} "
            f"| {r['sample_seps'] / 1e6:17.1f} | {r['us_per_call']:7.1f} | {ratio_p:>15} | {ratio_s:>13} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "num_nodes": args.num_nodes, "num_edges": num_edges, "fanouts": fanouts,
                       "batch_size": args.batch_size, "merge": args.merge, "rows": {label: r for label, r in rows}}, f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
